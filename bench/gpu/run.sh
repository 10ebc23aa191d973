#!/usr/bin/env bash
# bench/gpu: offgraph beside llama.cpp on one GPU, same files, same run (issue 33; docs/gpu.md).
# Runs where the GPU is (scripts/gpu.sh run calls it), from a bundle of binaries built on a CPU
# machine (scripts/gpu.sh bundle). Every figure goes to $OUT as it is measured, so that a run cut
# short still leaves what it had:
#   $OUT/bench.jsonl   one JSON object per measurement (offgraph bench and llama-bench -o jsonl)
#   $OUT/bench.log     what both printed on stderr
#
#   bench/gpu/run.sh BUNDLE OUT [--quick | --profile]
# --profile: first the kernels of a decode step of both engines under ncu (\$OUT/ncu.csv).
# BUNDLE holds bin/offgraph, bin/llama-bench and lib/ (LD_LIBRARY_PATH set by the caller).
# The models: Muse Glimmer 30B's per-layer shapes (embd 6656, 32/2 heads of 128, ff 19968,
# window 2048, 3 sliding to 1 global) with $GPU_BENCH_LAYERS layers (default 8) and the llama-bpe
# vocabulary (128,256 tokens; the real one has 202,048), written by offgraph synth on all cores.
# GPU_BENCH_SYNTH replaces the shape flags (a smoke run: GPU_BENCH_SYNTH='--preset small').
set -uo pipefail
bundle=$1 out=$2 quick=${3:-}
layers=${GPU_BENCH_LAYERS:-8}
models=${GPU_BENCH_MODELS:-/tmp/offgraph-gpu-models}
mkdir -p "$out" "$models"
jsonl=$out/bench.jsonl log=$out/bench.log
note() { printf '%s %s\n' "$(date -u +%T)" "$*" | tee -a "$log" >&2; }
# A JSON line of our own (what ran, its wall time) beside the engines' own lines.
mark() { printf '{"engine":"harness","what":"%s","seconds":%s}\n' "$1" "$2" >>"$jsonl"; }

synth() { # type -> path
  local type=$1 path=$models/glimmer30b-${layers}l-$1${GPU_BENCH_SYNTH:+-custom}.gguf t0=$SECONDS
  if [ ! -f "$path" ]; then
    # shellcheck disable=SC2086 # GPU_BENCH_SYNTH: other shapes for a smoke run on a CPU machine
    "$bundle/bin/offgraph" synth ${GPU_BENCH_SYNTH:---preset 30b --weights --layers $layers} --type "$type" \
      --vocab "$bundle/models/ggml-vocab-llama-bpe.gguf" --no-template -o "$path.part" \
      >>"$log" 2>&1 && mv "$path.part" "$path" || { note "synth $type failed"; return 1; }
    mark "synth $type $layers layers ($(du -m "$path" | cut -f1) MiB)" $((SECONDS - t0))
  fi
  echo "$path"
}

# One test on both engines, llama.cpp first. $1: model; the rest: llama-bench style flags that
# both take (-p, -n, -d, -r, -ctk/-ctv as --ctk/--ctv for offgraph).
both() {
  local model=$1 p=$2 n=$3 d=$4 r=$5 ct=$6 t0
  t0=$SECONDS
  timeout 300 "$bundle/bin/llama-bench" -m "$model" -ngl 99 -fa 1 -p "$p" -n "$n" -d "$d" -r "$r" \
    -ctk "$ct" -ctv "$ct" -t 8 -o jsonl >>"$jsonl" 2>>"$log" || note "llama-bench -p $p -n $n -d $d $ct failed"
  mark "llama-bench p$p n$n d$d $ct" $((SECONDS - t0))
  t0=$SECONDS
  timeout 300 "$bundle/bin/offgraph" bench -m "$model" -ngl all -p "$p" -n "$n" -d "$d" -r "$r" \
    --ctk "$ct" --ctv "$ct" -t 8 >>"$jsonl" 2>>"$log" || note "offgraph bench -p $p -n $n -d $d $ct failed"
  mark "offgraph p$p n$n d$d $ct" $((SECONDS - t0))
}

q8=$(synth q8_0) || exit 1
note "q8_0 model: $q8"
if [ "$quick" = --profile ]; then
  # Where a decode step's time goes on the GPU, both engines: every kernel's duration over about
  # one decode step (ncu, clocks left alone), after 1,000 kernels of warm-up, then both engines'
  # decode speed again in this run. $OUT/ncu.csv: a "# engine" line, then ncu's CSV.
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  for engine in offgraph llama; do
    if [ $engine = offgraph ]; then
      cmd=("$bundle/bin/offgraph" bench -m "$q8" -ngl all -p 0 -n 128 -r 1 -t 8)
    else
      cmd=("$bundle/bin/llama-bench" -m "$q8" -ngl 99 -fa 1 -p 0 -n 128 -r 1 -t 8)
    fi
    t0=$SECONDS
    rm -f /tmp/ncu-$engine.csv
    [ -n "$ncu" ] || { note "no ncu on this machine"; break; }
    timeout 150 "$ncu" --clock-control none --csv --metrics gpu__time_duration.sum \
      --launch-skip 1000 --launch-count 400 --log-file /tmp/ncu-$engine.csv "${cmd[@]}" >/dev/null 2>>"$log" \
      || note "ncu $engine failed"
    { echo "# engine $engine"; cat /tmp/ncu-$engine.csv 2>/dev/null; } >>"$out/ncu.csv"
    mark "ncu $engine" $((SECONDS - t0))
  done
fi
both "$q8" 512 128 0 3 f16
# The same greedy tokens on the GPU as on the CPU (logits rows compared in the gpu tests; here
# the 30B-shaped file): 64 random prompt tokens, 16 greedy steps, each way.
for where in "-ngl all" "--device none"; do
  # shellcheck disable=SC2086
  timeout 120 "$bundle/bin/offgraph" logits -m "$q8" --random 64 --seed 5 --greedy 16 -t 16 $where \
    2>>"$log" | sed "s/^/$where: /" >>"$out/greedy.txt"
done
[ "$(cut -d: -f2- "$out/greedy.txt" | sort -u | wc -l)" = 1 ] \
  || note "greedy tokens differ between the GPU and the CPU (greedy.txt)"
both "$q8" 512 128 4096 3 f16
# CUDA graphs off: the control for the decode rows.
t0=$SECONDS
{ GGML_CUDA_DISABLE_GRAPHS=1 timeout 120 "$bundle/bin/offgraph" bench -m "$q8" -ngl all -p 0 -n 128 -d 0 -r 3 -t 8 \
  2>>"$log" || note "offgraph with CUDA graphs off failed"; } \
  | sed 's/^{"engine":"offgraph"/{"engine":"offgraph","cuda_graphs":false/' >>"$jsonl"
mark "offgraph graphs off" $((SECONDS - t0))
{ GGML_CUDA_DISABLE_GRAPHS=1 timeout 120 "$bundle/bin/llama-bench" -m "$q8" -ngl 99 -fa 1 -p 0 -n 128 -r 3 -t 8 -o jsonl \
  2>>"$log" || note "llama-bench with CUDA graphs off failed"; } \
  | sed 's/^{/{"cuda_graphs":false,/' >>"$jsonl"
# The cost of a verify step of k + 1 tokens over a one-token step.
timeout 120 "$bundle/bin/offgraph" bench -m "$q8" -ngl all --verify 1,2,4,8,16 -d 0 -r 5 -t 8 >>"$jsonl" 2>>"$log" \
  || note "verify failed"
[ "$quick" = --quick ] && exit 0
both "$q8" 512 128 0 3 q8_0
q4=$(synth q4_K) || exit 1
note "q4_K model: $q4"
both "$q4" 512 128 0 3 f16
both "$q4" 512 128 4096 3 f16
both "$q8" 512 128 32768 2 f16
note "done"
