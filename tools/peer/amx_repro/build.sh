#!/bin/sh
# Builds, into $OUT (default /tmp/amx_repro):
#   repro        repro.cpp linked against the pinned peer build's static ggml
#                (the same libggml-cpu.a as llama-bench)           -> crashes
#   repro_nodse  the same, but ggml-cpu/amx/mmq.cpp recompiled with the peer's
#                flags plus -fno-dse, linked ahead of libggml-cpu.a -> works
#   repro_fixed  the same, mmq.cpp with _tile_loadconfig(&tc) replaced by an asm
#                whose memory operand is the whole 64-byte struct  -> works
#   mmq_O3.s / mmq_nodse.s   the code before ldtilecfg, printed at the end
# TREE: the pinned llama.cpp source tree; PEER: its CMake build directory.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
TREE=${TREE:-/root/.cache/offgraph/llama.cpp-fd570ef54b10ec5fecb739e7e04c8ce44a6f415a}
PEER=${PEER:-/root/.cache/offgraph/peer-fd570ef54b10-948acfaff05ccfbe}
OUT=${OUT:-/tmp/amx_repro}
CXX=${CXX:-g++}
mkdir -p "$OUT"

LIBS="-Wl,--start-group $PEER/ggml/src/libggml.a $PEER/ggml/src/libggml-cpu.a $PEER/ggml/src/libggml-base.a -Wl,--end-group -fopenmp -lpthread -ldl -lm"
REPRO_FLAGS="-O2 -g -std=c++17 -I$TREE/ggml/include"
# flags of ggml-cpu/amx/mmq.cpp in the peer build (its compile_commands.json)
MMQ_FLAGS="-DGGML_SCHED_MAX_COPIES=4 -DGGML_USE_CPU_REPACK -DGGML_USE_LLAMAFILE -DGGML_USE_OPENMP -D_GNU_SOURCE -D_XOPEN_SOURCE=600 \
 -I$TREE/ggml/src -I$TREE/ggml/src/ggml-cpu -I$TREE/ggml/src/ggml-cpu/amx -I$TREE/ggml/include -O3 -DNDEBUG -march=native -fopenmp -std=gnu++17"

# 1. the reproduction as such
$CXX $REPRO_FLAGS "$HERE/repro.cpp" -o "$OUT/repro" $LIBS

# 2. unchanged mmq.cpp, GCC's RTL dead-store elimination off
$CXX $MMQ_FLAGS -fno-dse -c "$TREE/ggml/src/ggml-cpu/amx/mmq.cpp" -o "$OUT/mmq_nodse.o"
$CXX $REPRO_FLAGS "$HERE/repro.cpp" "$OUT/mmq_nodse.o" -o "$OUT/repro_nodse" $LIBS

# 3. mmq.cpp with the tile config loaded through a full 64-byte memory operand
sed 's|_tile_loadconfig(&tc);|__asm__ volatile("ldtilecfg %0" :: "m"(tc));|' \
    "$TREE/ggml/src/ggml-cpu/amx/mmq.cpp" > "$OUT/mmq_fixed.cpp"
grep -q 'ldtilecfg %0' "$OUT/mmq_fixed.cpp"
$CXX $MMQ_FLAGS -c "$OUT/mmq_fixed.cpp" -o "$OUT/mmq_fixed.o"
$CXX $REPRO_FLAGS "$HERE/repro.cpp" "$OUT/mmq_fixed.o" -o "$OUT/repro_fixed" $LIBS

# 4. what the compiler emits before ldtilecfg (peer flags, and with -fno-dse)
for v in O3 nodse; do
    extra=""; [ $v = nodse ] && extra=-fno-dse
    $CXX $MMQ_FLAGS $extra -S "$TREE/ggml/src/ggml-cpu/amx/mmq.cpp" -o "$OUT/mmq_$v.s"
    echo "--- mmq.cpp $v: instructions before ldtilecfg"
    grep -B12 'ldtilecfg' "$OUT/mmq_$v.s" | grep -v -e '^\s*\.' -e '^#' -e '^\.L'
done
echo "compiler: $($CXX --version | head -1)"
echo "header:   $(grep -h 'ldtilecfg' $($CXX -print-file-name=include)/amxtileintrin.h)"
echo "built: $(cd "$OUT" && ls repro repro_nodse repro_fixed | tr '\n' ' ')"
