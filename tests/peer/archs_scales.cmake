# offgraph applies the per-tensor weight scales that llama.cpp's muse-glimmer graph loads but does
# not apply (attn_gate, ffn_gate/up/down .scale): offgraph on a generator file whose scales are
# -1.5, -2, 3 and 0.5 (one value per kind, so a mix-up shows) must agree with llama.cpp on the
# same file with the scales set to 1 and folded into the weights (W * s), and must differ from
# llama.cpp on the file with scales 1 and weights unchanged (so the check fails if the scales were
# ignored).
# -D: GEN OFFGRAPH PEER COMPARE FILL DIR SEED
include(${CMAKE_CURRENT_LIST_DIR}/archs_files.cmake)
archs_files("scales-${SEED}" "^muse-glimmer$")
set(base "${dir}/muse-glimmer-dense.gguf")
set(scaled_rules)
set(folded_rules)
set(unscaled_rules)
foreach(kind_value "attn_gate=-1.5" "ffn_gate=-2" "ffn_up=3" "ffn_down=0.5")
  string(REPLACE "=" ";" kv "${kind_value}")
  list(GET kv 0 kind)
  list(GET kv 1 value)
  list(APPEND scaled_rules "blk\\.[0-9]+\\.${kind}\\.scale=${value}")
  list(APPEND folded_rules "blk\\.[0-9]+\\.${kind}\\.scale=1" "blk\\.[0-9]+\\.${kind}\\.weight*=${value}")
  list(APPEND unscaled_rules "blk\\.[0-9]+\\.${kind}\\.scale=1")
endforeach()
run_step(out ${FILL} ${base} ${dir}/scaled.gguf ${scaled_rules})
run_step(out ${FILL} ${base} ${dir}/folded.gguf ${folded_rules})
run_step(out ${FILL} ${base} ${dir}/unscaled.gguf ${unscaled_rules})
set(common --random 96 --seed ${SEED} --chunk 12 --greedy 32)
run_step(out ${OFFGRAPH} logits -m ${dir}/scaled.gguf ${common} -o ${dir}/ours)
run_step(out ${PEER} -m ${dir}/folded.gguf ${common} -o ${dir}/folded)
run_step(out ${PEER} -m ${dir}/unscaled.gguf ${common} -o ${dir}/unscaled)
run_step(out ${COMPARE} ${dir}/ours ${dir}/folded 1e-5)
message(STATUS "scales applied, against the folded weights: ${out}")
execute_process(COMMAND ${COMPARE} ${dir}/ours ${dir}/unscaled 1e-2 RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE_RECURSE "${dir}")
if(rc EQUAL 0)
  message(FATAL_ERROR "offgraph's logits agree with the unscaled file: the scales were not applied\n${out}")
endif()
message(STATUS "and against the unscaled file (must differ): ${out}")
