#!/usr/bin/env bash
# The GPU checks of issue 33 (docs/gpu.md), in two halves:
#
#   scripts/gpu.sh bundle [DIR]     on a CPU machine with nvcc (no GPU needed): builds the CUDA
#                                   variant (make cuda: ggml's CUDA backend for OFFGRAPH_CUDA_ARCHS,
#                                   default 90) and llama.cpp's llama-bench on the same ggml, and
#                                   packs the binaries, the libraries they need that a bare CUDA
#                                   machine may lack, and the vocabulary the benchmark models use
#                                   into DIR/bundle.tar.xz (default .gpu/, git-ignored; ~40 MiB)
#   scripts/gpu.sh run OUT [--quick|--profile]   (GPU_BUNDLE: another bundle than .gpu/'s)
#                                   on the GPU machine (CUDA runtime and cuBLAS 13 installed, no
#                                   -dev packages, no network): unpacks the bundle, lists the
#                                   devices, runs the `gpu` tests and the CLI devices check, then
#                                   bench/gpu/run.sh; everything it measures lands in OUT as it
#                                   goes (env.txt, tests.txt, bench.jsonl, bench.log)
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
die() { printf '[gpu] error: %s\n' "$*" >&2; exit 1; }

bundle() {
  set -e
  local dir=${1:-$root/.gpu} stage
  make -C "$root" cuda ${CUDA_DIR:+CUDA_DIR=$CUDA_DIR} >&2
  local peer
  peer=$(OFFGRAPH_PEER_CUDA=1 "$here/peer.sh" llama-bench | tail -1)
  local ggml_prefix
  ggml_prefix=$("$here/deps.sh" --cuda | tail -1)
  ggml_prefix=$(cd "$ggml_prefix/../../.." && pwd)
  local src
  src=$("$here/deps.sh" --source | tail -1)
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib" "$stage/models" "$dir"
  local cuda_dir=$root/${CUDA_DIR:-build-cuda}
  cp "$cuda_dir/bin/offgraph" "$cuda_dir/bin/gpu_tests" "$stage/bin/"
  cp "$peer/bin/llama-bench" "$stage/bin/"
  cp -P "$ggml_prefix"/lib/*.so* "$stage/lib/"
  cp -P "$peer"/bin/*.so* "$stage/lib/" 2>/dev/null || true
  find "$peer" -name 'libllama*.so*' -exec cp -P {} "$stage/lib/" \;
  cp "$src/models/ggml-vocab-llama-bpe.gguf" "$stage/models/"
  # Libraries a bare CUDA image may lack (Debian's, by soname). Not libc, libstdc++ (a newer one
  # is there), or the CUDA runtime and cuBLAS (too large; installed with CUDA there).
  local lib
  for bin in "$stage"/bin/*; do
    LD_LIBRARY_PATH="$stage/lib" ldd "$bin" | awk '/=> \//{print $1" "$3}'
  done | sort -u | while read -r name path; do
    case "$name" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
      libcuda.so*|libcudart.so*|libcublas*.so*) ;;
      *) [ -e "$stage/lib/$name" ] || cp -L "$path" "$stage/lib/$name" ;;
    esac
  done
  # Symbols off (libggml-cuda.so: 66 to 59 MB), and xz's strongest preset: the device call
  # carries the checkout and the bundle in 64 MiB.
  find "$stage/bin" "$stage/lib" -type f -exec strip --strip-unneeded {} \; 2>/dev/null || true
  tar -C "$stage" -cf - . | xz -T0 -9e >"$dir/bundle.tar.xz"
  rm -rf "$stage"
  printf '[gpu] %s: %s\n' "$dir/bundle.tar.xz" "$(du -h "$dir/bundle.tar.xz" | cut -f1)" >&2
  echo "$dir/bundle.tar.xz"
}

run() {
  local out=${1:?usage: scripts/gpu.sh run OUT [--quick]} quick=${2:-}
  local tarball=${GPU_BUNDLE:-$root/.gpu/bundle.tar.xz} b=/tmp/offgraph-gpu-bundle
  [ -f "$tarball" ] || die "no $tarball: make it with 'scripts/gpu.sh bundle' on a CPU machine"
  rm -rf "$b" # never a stale binary from an earlier bundle
  mkdir -p "$out" "$b"
  if command -v xz >/dev/null; then
    (set -o pipefail; xz -dc "$tarball" | tar -C "$b" -xf -) || die "unpacking $tarball failed"
  else
    python3 -c 'import lzma,sys,tarfile; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])' "$tarball" "$b" \
      || die "unpacking $tarball failed"
  fi
  # The CUDA runtime and cuBLAS of the machine: the toolkit's, or the pip wheels'.
  local cuda_libs=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    $(python3 -c 'import nvidia,os;p=os.path.dirname(nvidia.__path__[0]);print(" ".join(os.path.join(r) for r,_,f in os.walk(p) if any(x.startswith("libcublas.so") or x.startswith("libcudart.so") for x in f)))' 2>/dev/null); do
    [ -d "$d" ] && cuda_libs="$cuda_libs:$d"
  done
  export LD_LIBRARY_PATH="$b/lib$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  {
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
    lscpu | grep -E 'Model name|^CPU\(s\)'
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    ldd "$b/bin/offgraph" | grep -E 'not found|cuda|cublas|ggml'
    "$b/bin/offgraph" logits --list-devices
  } >"$out/env.txt" 2>&1
  cat "$out/env.txt" >&2
  {
    timeout 200 "$b/bin/gpu_tests" 2>&1
    echo "gpu_tests exit $?"
    timeout 120 cmake -DOFFGRAPH="$b/bin/offgraph" -DDIR=/tmp/offgraph-gpu-cli -P "$root/tests/cli/devices.cmake" 2>&1
    echo "cli devices exit $?"
  } >"$out/tests.txt"
  tail -n 30 "$out/tests.txt" >&2
  "$root/bench/gpu/run.sh" "$b" "$out" $quick
}

case "${1:-}" in
  bundle) shift; bundle "$@" ;;
  run) shift; run "$@" ;;
  *) die "usage: scripts/gpu.sh bundle [DIR] | scripts/gpu.sh run OUT [--quick]" ;;
esac
