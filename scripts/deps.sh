#!/usr/bin/env bash
# Installs what offgraph needs on a fresh Debian machine, then fetches, verifies and builds the
# pinned ggml once. Everything heavy lives in a cache outside the checkout, keyed by the pinned
# tree hash (and, for the build, by compiler and CPU), so a second run touches no network and
# rebuilds nothing.
#
# Prints, as its last line, the ggml CMake package directory (for -Dggml_DIR=...).
#
#   scripts/deps.sh            apt packages + source + ggml build   (what `make` runs)
#   scripts/deps.sh --source   apt packages + verified source only; prints the source dir
#   scripts/deps.sh --cuda     the CUDA variant of the same ggml (docs/gpu.md): shared libraries
#                              (one copy of the CUDA kernels for offgraph, its tests and the peer),
#                              the CPU part portable (x86-64-v3, no -march=native: the binaries go
#                              to GPU machines), CUDA architectures $OFFGRAPH_CUDA_ARCHS (default
#                              90, the H100/H200), no VMM (so a binary starts where there is no
#                              driver and runs on the CPU). Needs nvcc.
#
# Environment: OFFGRAPH_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/offgraph).
set -euo pipefail

# The pin. node-llama-cpp ships the unmodified upstream llama.cpp release tree as a git bundle;
# it is the only registry we can reach that carries ggml with its symbols untouched.
readonly NPM_PACKAGE="node-llama-cpp@3.22.1"
readonly LLAMA_CPP_RELEASE="v0.5.0"
readonly TREE_HASH="fd570ef54b10ec5fecb739e7e04c8ce44a6f415a"
readonly BUNDLE_PATH="package/llama/gitRelease.bundle"

# clang, its sanitizer and libFuzzer runtimes (libclang-rt) and libomp (ggml's OpenMP under clang)
# build the fuzz targets `make test` runs (docs/reliability.md). python3-lark writes the Lark test
# vectors (tests/sample/lark_vectors.py). nginx and its JavaScript module
# put replicas behind one address with conversation affinity (deploy/replicas, its test); where an
# init system runs, Debian's package also starts a system nginx on port 80 (deploy/ runs its own).
readonly APT_PACKAGES=(cmake g++ make git ninja-build ccache pkg-config libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev
  python3 python3-jsonschema python3-lark ca-certificates clang libclang-rt-14-dev libomp-dev nginx libnginx-mod-http-js
  libpng-dev libjpeg62-turbo-dev libstb-dev python3-pil python3-numpy libssl-dev)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cache=${OFFGRAPH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/offgraph}
mode=${1:-all}

fetch_tmp=""
trap '[ -z "$fetch_tmp" ] || rm -rf "$fetch_tmp"' EXIT

log() { printf '[deps] %s\n' "$*" >&2; }
die() { printf '[deps] error: %s\n' "$*" >&2; exit 1; }

install_apt_packages() {
  local missing=() p
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  # npm only fetches the source; a machine may carry its own Node.js outside Debian's packages.
  command -v npm >/dev/null || missing+=(nodejs npm)
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq >&2 || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
    || die "apt-get install ${missing[*]} failed"
}

# Clones the bundle into $cache/llama.cpp-$TREE_HASH (sets src), refusing any tree but the pinned
# one. Runs in this shell, not a subshell, so that the EXIT trap removes a failed fetch.
fetch_source() {
  local dest="$cache/llama.cpp-$TREE_HASH"
  src=$dest
  [ -f "$dest/.offgraph-verified" ] && return 0
  mkdir -p "$cache"
  fetch_tmp=$(mktemp -d "$cache/fetch.XXXXXX")
  local tmp=$fetch_tmp
  log "fetching $NPM_PACKAGE (llama.cpp $LLAMA_CPP_RELEASE) from the npm registry"
  (cd "$tmp" && npm pack "$NPM_PACKAGE" --ignore-scripts --silent >/dev/null) || die "npm pack $NPM_PACKAGE failed"
  tar -xzf "$tmp"/node-llama-cpp-*.tgz -C "$tmp" "$BUNDLE_PATH" || die "$BUNDLE_PATH missing from the npm tarball"
  git clone -q "$tmp/$BUNDLE_PATH" "$tmp/src" 2>/dev/null || die "git clone of the bundle failed"
  local got
  got=$(git -C "$tmp/src" rev-parse 'HEAD^{tree}')
  [ "$got" = "$TREE_HASH" ] || die "tree hash mismatch: expected $TREE_HASH, the bundle holds $got; refusing to build on it"
  rm -rf "$dest"
  mv "$tmp/src" "$dest"
  echo "$TREE_HASH" >"$dest/.offgraph-verified"
  log "verified tree $TREE_HASH at $dest"
}

# The build is keyed by what changes the objects: tree, compiler, CPU features (GGML_NATIVE
# compiles with -march=native) and the options below.
# GGML_LLAMAFILE: llamafile's tiled GEMM for prefill matrix products (on by default in llama.cpp's
# own build, off in ggml's; +45% prefill on Q8_0 here, docs/performance-log.md).
# GGML_RPC: the RPC backend (layers on other machines, docs/backends.md), and ggml-rpc-server
# beside the library (the wrapper builds tools/rpc against this same ggml); RDMA off (no
# libibverbs development files, and TCP is what the docs describe).
readonly GGML_OPTIONS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON
  -DGGML_OPENMP=ON -DGGML_BACKEND_DL=OFF -DGGML_CCACHE=OFF -DGGML_LLAMAFILE=ON
  -DGGML_RPC=ON -DGGML_RPC_RDMA=OFF)

# The CUDA variant (--cuda). GGML_CUDA_GRAPHS: replay a step's graph as a CUDA graph when its
# splits keep their ids (offgraph's graph reuse keeps them). NCCL off (one process, no
# collectives; not on the machines). The default flash-attention K/V type pairs (f16, bf16, q8_0,
# q4_0) have kernels of their own; ggml-cuda converts other K/V types to f16 for attention.
readonly CUDA_ARCHS=${OFFGRAPH_CUDA_ARCHS:-90}
readonly GGML_CUDA_OPTIONS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF
  -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
  -DGGML_OPENMP=ON -DGGML_BACKEND_DL=OFF -DGGML_CCACHE=OFF -DGGML_LLAMAFILE=ON
  -DGGML_RPC=ON -DGGML_RPC_RDMA=OFF -DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS"
  -DGGML_CUDA_GRAPHS=ON -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_NO_VMM=ON
  '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib;$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON)

# Bump when what the build leaves in the prefix changes.
readonly BUILD_FORMAT=1

build_key() {
  {
    echo "$TREE_HASH format $BUILD_FORMAT"
    c++ --version | head -1
    if [ "$variant" = cuda ]; then
      nvcc --version | tail -1 # the CPU part is portable: not keyed by this CPU
      echo "${GGML_CUDA_OPTIONS[*]}"
    else
      grep -m1 '^flags' /proc/cpuinfo || uname -m
      echo "${GGML_OPTIONS[*]}"
    fi
    cat "$root/cmake/ggml-prebuild/CMakeLists.txt"
  } | sha256sum | cut -c1-16
}

build_ggml() {
  local src=$1 key prefix
  key=$(build_key)
  prefix="$cache/ggml-${TREE_HASH:0:12}-$key"
  local options=("${GGML_OPTIONS[@]}") what="CPU and RPC backends, static"
  if [ "$variant" = cuda ]; then
    prefix="$cache/ggml-cuda-${TREE_HASH:0:12}-$key"
    options=("${GGML_CUDA_OPTIONS[@]}")
    what="CUDA (architectures $CUDA_ARCHS), CPU and RPC backends, shared"
  fi
  # Two runs at once (a build and a test tree, two checkouts) wait for each other here instead of
  # building into the same prefix; the second then finds the build complete.
  exec {lock_fd}>"$prefix.lock"
  flock "$lock_fd"
  if [ -f "$prefix/.offgraph-complete" ]; then
    echo "$src" >"$prefix/offgraph-source.txt" # the source may have been re-fetched elsewhere
    echo "$prefix/lib/cmake/ggml"; return 0
  fi
  log "building ggml ($what) into $prefix; this happens once per build key (tree, compiler, options; for the CPU build, CPU features too)"
  local start=$SECONDS gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  rm -rf "$prefix.build" "$prefix"
  cmake -S "$root/cmake/ggml-prebuild" -B "$prefix.build" "${gen[@]}" -DOFFGRAPH_GGML_TREE="$src" \
    -DCMAKE_INSTALL_PREFIX="$prefix" "${options[@]}" >"$prefix.log" 2>&1 \
    || die "ggml configure failed; see $prefix.log"
  cmake --build "$prefix.build" -j "$(nproc)" >>"$prefix.log" 2>&1 || die "ggml build failed; see $prefix.log"
  cmake --install "$prefix.build" >>"$prefix.log" 2>&1 || die "ggml install failed; see $prefix.log"
  rm -rf "$prefix.build"
  echo "$TREE_HASH" >"$prefix/offgraph-ggml-tree.txt"
  echo "$src" >"$prefix/offgraph-source.txt"
  date -u +%FT%TZ >"$prefix/.offgraph-complete"
  log "ggml built in $((SECONDS - start)) s"
  echo "$prefix/lib/cmake/ggml"
}

# nvcc: on PATH, or where the CUDA toolkit installs it.
find_nvcc() {
  command -v nvcc >/dev/null && return 0
  local d
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    [ -x "$d/nvcc" ] && { export PATH="$d:$PATH"; return 0; }
  done
  die "--cuda needs nvcc (the CUDA toolkit); none on PATH or in /usr/local/cuda*/bin"
}

variant=cpu
install_apt_packages
fetch_source
case "$mode" in
  --source) echo "$src" ;;
  all) build_ggml "$src" ;;
  --cuda) variant=cuda; find_nvcc; build_ggml "$src" ;;
  *) die "unknown argument '$mode' (expected nothing, --source or --cuda)" ;;
esac
