# offgraph applies the per-tensor weight scales that llama.cpp's muse-glimmer graph loads but does
# not apply (attn_gate, ffn_gate/up/down .scale): offgraph on a generator file whose scales are
# all -2 must agree with llama.cpp on the same file with the scales set to 1 and folded into the
# weights (W * -2), and must differ from llama.cpp on the file with scales 1 and weights unchanged
# (so the check fails if the scales were ignored).
# -D: GEN OFFGRAPH PEER COMPARE FILL DIR SEED
set(dir "${DIR}/archs-scales-${SEED}")
file(REMOVE_RECURSE "${dir}")
file(MAKE_DIRECTORY "${dir}")
include(${CMAKE_CURRENT_LIST_DIR}/../run_step.cmake)
set(CLEANUP "${dir}")
run_step(out ${GEN} -a "^muse-glimmer$" -s ${SEED} -o ${dir})
set(base "${dir}/muse-glimmer-dense.gguf")
set(r "blk\\.[0-9]+\\.(attn_gate|ffn_gate|ffn_up|ffn_down)")
run_step(out ${FILL} ${base} ${dir}/scaled.gguf "${r}\\.scale=-2")
run_step(out ${FILL} ${base} ${dir}/folded.gguf "${r}\\.scale=1" "${r}\\.weight*=-2")
run_step(out ${FILL} ${base} ${dir}/unscaled.gguf "${r}\\.scale=1")
set(common --random 96 --seed ${SEED} --chunk 12 --greedy 32)
run_step(out ${OFFGRAPH} logits -m ${dir}/scaled.gguf ${common} -o ${dir}/ours)
run_step(out ${PEER} -m ${dir}/folded.gguf ${common} -o ${dir}/folded)
run_step(out ${PEER} -m ${dir}/unscaled.gguf ${common} -o ${dir}/unscaled)
run_step(out ${COMPARE} ${dir}/ours ${dir}/folded 1e-3)
message(STATUS "scales applied, against the folded weights: ${out}")
execute_process(COMMAND ${COMPARE} ${dir}/ours ${dir}/unscaled 1e-2 RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE_RECURSE "${dir}")
if(rc EQUAL 0)
  message(FATAL_ERROR "offgraph's logits agree with the unscaled file: the scales were not applied\n${out}")
endif()
message(STATUS "and against the unscaled file (must differ): ${out}")
