#!/usr/bin/env bash
# `offgraph serve -ngl all` on the shipped model: where there is no GPU (CI, and the CUDA build
# without a driver) it starts, says why on stderr, and answers a chat completion from the CPU;
# where there is one, the answer comes from the GPU and the placement line names it.
#   serve_devices.sh OFFGRAPH MODEL WORKDIR
set -euo pipefail
offgraph=$1 model=$2 dir=$3
mkdir -p "$dir"
log=$dir/serve-devices.log
. "$(dirname "${BASH_SOURCE[0]}")/../serve_ready.sh"
serve_ready "$log" "$offgraph" serve -m "$model" --port 0 -ngl all -c 512 --parallel 1
answer=$(curl -s "http://127.0.0.1:$port/v1/chat/completions" \
  -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"temperature":0}')
echo "$answer"
echo "$answer" | grep -q '"finish_reason"' || { cat "$log"; echo "no completion"; exit 1; }
if "$offgraph" serve --list-devices | grep -q '^no GPU: '; then
  grep -q 'offgraph: no GPU (.*): every layer runs on the CPU' "$log" \
    || { cat "$log"; echo "serve -ngl all without a GPU did not say so"; exit 1; }
else
  grep -q 'CUDA0.*layers 0-' "$log" || { cat "$log"; echo "no layers placed on the GPU"; exit 1; }
fi
echo "serve -ngl all: ok"
