#!/usr/bin/env bash
# The perplexity figures of docs/quality.md, as markdown table rows on stdout:
#
#   tools/train/quality.sh [OFFGRAPH [MODEL [TEXT [CTX [BATCH]]]]]
#
# offgraph against llama-perplexity from the pinned tree (scripts/peer.sh builds it), K and V
# storage types, and rings against full caches on every layer. Two threads throughout.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
og=${1:-$root/build/bin/offgraph}
model=${2:-$root/models/muse-glimmer-kjv.gguf}
text=${3:-$root/models/kjv-heldout.txt}
ctx=${4:-512}
batch=${5:-64}
ppl() { "$og" perplexity -m "$model" -f "$text" -c "$ctx" -b "$batch" -t 2 "$@" 2>/dev/null | sed -n 's/^PPL = //p'; }

echo "### offgraph and llama-perplexity (-c $ctx -b $batch, K and V f16)"
echo
echo "| program | PPL |"
echo "|---|---|"
echo "| offgraph perplexity | $(ppl) |"
peer=$("$root/scripts/peer.sh" llama-perplexity 2>/dev/null | tail -1)
for fa in on off; do
  l=$("$peer/bin/llama-perplexity" -m "$model" -f "$text" -c "$ctx" -b "$batch" -ub "$batch" -t 2 \
    -ctk f16 -ctv f16 -fa "$fa" 2>&1 | sed -n 's/.*Final estimate: PPL = //p')
  echo "| llama-perplexity, flash attention $fa | $l |"
done
echo
echo "### K and V storage types (rows K, columns V)"
echo
echo "| K \\ V | f16 | q8_0 | q4_0 |"
echo "|---|---|---|---|"
for k in f16 q8_0 q4_0; do
  row="| $k |"
  for v in f16 q8_0 q4_0; do row="$row $(ppl --ctk "$k" --ctv "$v") |"; done
  echo "$row"
done
echo
echo "### Rings and full caches (K and V f16)"
echo
echo "| caches | PPL |"
echo "|---|---|"
echo "| rings on the sliding layers, physical order (default) | $(ppl) |"
echo "| rings, logical order | $(ppl --ring-order logical) |"
echo "| full caches on every layer | $(ppl --full-cache) |"
echo "| f32 storage: rings, physical order | $(ppl --ctk f32 --ctv f32) |"
echo "| f32 storage: rings, logical order | $(ppl --ctk f32 --ctv f32 --ring-order logical) |"
echo "| f32 storage: full caches | $(ppl --ctk f32 --ctv f32 --full-cache) |"
