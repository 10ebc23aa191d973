# RoPE keys offgraph honours, against llama.cpp on generator files: llama with linear scaling
# (rope.scaling.factor 4) and rope.scaling.attn_factor 0.5 must agree with llama.cpp and differ
# from llama.cpp on the unscaled file (so ignoring the keys fails the test); muse-glimmer with
# attn_factor 0.5 must agree, and a muse-glimmer scaling factor (which llama.cpp never applies to
# its rotated, sliding layers) must be refused by name.
# -D: GEN OFFGRAPH PEER COMPARE FILL DIR SEED
include(${CMAKE_CURRENT_LIST_DIR}/archs_files.cmake)
archs_files("rope-${SEED}" "^(llama|muse-glimmer)$")
set(common --random 96 --seed ${SEED} --chunk 12 --greedy 32)

# The generator's weights (stdev 0.1) make attention nearly uniform, where positions hardly
# matter: sharper queries and keys, and frequency factors of 1, make RoPE decide the result.
set(sharp "blk\\.[0-9]+\\.attn_[qk]\\.weight*=8" "blk\\.[0-9]+\\.attn_[qk]\\.scale=1"
          "rope_freqs\\.weight=1")
run_step(out ${FILL} ${dir}/llama-dense.gguf ${dir}/llama-plain.gguf ${sharp})
run_step(out ${FILL} ${dir}/llama-dense.gguf ${dir}/llama-rope.gguf ${sharp}
         key:llama.rope.scaling.factor=4 key:llama.rope.scaling.attn_factor=0.5)
run_step(out ${OFFGRAPH} logits -m ${dir}/llama-rope.gguf ${common} -o ${dir}/ours)
run_step(out ${PEER} -m ${dir}/llama-rope.gguf ${common} -o ${dir}/theirs)
run_step(out ${PEER} -m ${dir}/llama-plain.gguf ${common} -o ${dir}/plain)
run_step(out ${COMPARE} ${dir}/ours ${dir}/theirs 1e-5)
message(STATUS "llama, rope.scaling.factor 4, attn_factor 0.5: ${out}")
execute_process(COMMAND ${COMPARE} ${dir}/ours ${dir}/plain 1e-4 RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  file(REMOVE_RECURSE "${dir}")
  message(FATAL_ERROR "the scaled llama file computes what the unscaled one does: the RoPE keys were ignored\n${out}")
endif()
message(STATUS "  against the unscaled file (must differ): ${out}")

set(r "blk\\.[0-9]+\\.(attn_gate|ffn_gate|ffn_up|ffn_down)\\.scale=1")
run_step(out ${FILL} ${dir}/muse-glimmer-dense.gguf ${dir}/muse-rope.gguf "${r}" key:muse-glimmer.rope.scaling.attn_factor=0.5)
run_step(out ${OFFGRAPH} logits -m ${dir}/muse-rope.gguf ${common} -o ${dir}/ours)
run_step(out ${PEER} -m ${dir}/muse-rope.gguf ${common} -o ${dir}/theirs)
run_step(out ${COMPARE} ${dir}/ours ${dir}/theirs 1e-5)
message(STATUS "muse-glimmer, attn_factor 0.5: ${out}")

run_step(out ${FILL} ${dir}/muse-glimmer-dense.gguf ${dir}/muse-factor.gguf "${r}" key:muse-glimmer.rope.scaling.factor=4)
execute_process(COMMAND ${OFFGRAPH} logits -m ${dir}/muse-factor.gguf --random 4 RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE_RECURSE "${dir}")
if(rc EQUAL 0 OR NOT err MATCHES "RoPE scaling \\(factor 4")
  message(FATAL_ERROR "a muse-glimmer RoPE scaling factor was not refused (${rc}): ${err}")
endif()
