#!/usr/bin/env bash
# Builds targets of the pinned llama.cpp tree (our peer for comparisons: libllama, llama-bench,
# llama-server, ...) in a cache outside the checkout, once per tree, compiler and CPU; later
# calls reuse what is built. Prints the build directory as its last line.
#
#   scripts/peer.sh [target ...]      default targets: llama, test-llama-archs (the generator of
#                                     the peer corpus, docs/peer.md), llama-mtmd-cli (the
#                                     vision reference, tests/peer/vision_peer_test.cpp)
#   OFFGRAPH_PEER_RPC=1 scripts/peer.sh llama-bench
#                                     a second build with ggml-rpc (GGML_RPC), for the backends
#                                     benchmark's llama-bench --rpc; `make test` never builds it
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${OFFGRAPH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/offgraph}
log() { printf '[peer] %s\n' "$*" >&2; }
die() { printf '[peer] error: %s\n' "$*" >&2; exit 1; }

src=$("$here/deps.sh" --source | tail -1)
tree=$(cat "$src/.offgraph-verified")
cuda=()
if [ "${OFFGRAPH_PEER_CUDA:-0}" = 1 ]; then
  ggml_prefix=$("$here/deps.sh" --cuda | tail -1)
  cuda=(-DLLAMA_USE_SYSTEM_GGML=ON "-Dggml_DIR=$ggml_prefix" -DBUILD_SHARED_LIBS=ON
    '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib;$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON)
fi
readonly OPTIONS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DGGML_CCACHE=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=ON
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON
  $([ "${OFFGRAPH_PEER_RPC:-0}" = 1 ] && echo "-DGGML_RPC=ON -DGGML_RPC_RDMA=OFF") "${cuda[@]}")
key=$({ echo "$tree"; c++ --version | head -1; grep -m1 '^flags' /proc/cpuinfo || uname -m; echo "${OPTIONS[*]}"; } \
  | sha256sum | cut -c1-16)
dir="$cache/peer-${tree:0:12}-$key"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(llama test-llama-archs llama-mtmd-cli)

if [ ! -f "$dir/.configured" ]; then
  log "configuring the llama.cpp peer in $dir"
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  rm -rf "$dir"
  mkdir -p "$dir"
  cmake -S "$src" -B "$dir" "${gen[@]}" "${OPTIONS[@]}" >"$dir/configure.log" 2>&1 \
    || die "configure failed; see $dir/configure.log"
  touch "$dir/.configured"
fi
for t in "${targets[@]}"; do
  [ -f "$dir/.built-$t" ] && continue
  log "building $t (once; later runs reuse it)"
  start=$SECONDS
  cmake --build "$dir" -j "$(nproc)" --target "$t" >"$dir/build-$t.log" 2>&1 || die "building $t failed; see $dir/build-$t.log"
  touch "$dir/.built-$t"
  log "$t built in $((SECONDS - start)) s"
done
echo "$dir"
