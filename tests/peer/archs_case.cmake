# One file of llama.cpp's own generator (test-llama-archs: random weights, every optional tensor
# and key the architecture knows, llama.cpp's `test` tokenizer), compared against libllama on the
# same file: a random prompt three windows long in chunks (so rings wrap), then greedy decoding;
# every logits row and every greedy pick. For muse-glimmer, the per-tensor scales llama.cpp's
# graph loads but never applies (attn_gate, ffn_gate/up/down .scale) are set to 1 first, so that
# both sides compute one model (docs/peer.md); archs_scales.cmake checks that offgraph applies them.
# The generator's MoE llama file must be refused by name, and text commands must say that the
# `test` tokenizer has no text form.
# -D: GEN OFFGRAPH PEER COMPARE FILL DIR ARCH SEED KV TOL
include(${CMAKE_CURRENT_LIST_DIR}/archs_files.cmake)
archs_files("${ARCH}-${SEED}-${KV}" "^${ARCH}$")
set(model "${dir}/${ARCH}-dense.gguf")
if(ARCH STREQUAL "muse-glimmer")
  run_step(out ${FILL} ${model} ${dir}/same.gguf "blk\\.[0-9]+\\.(attn_gate|ffn_gate|ffn_up|ffn_down)\\.scale=1")
  set(model "${dir}/same.gguf")
endif()
if(ARCH STREQUAL "llama")
  execute_process(COMMAND ${OFFGRAPH} logits -m ${dir}/llama-moe.gguf --random 4
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT err MATCHES "expert_count' = 2: mixture-of-experts llama files are not supported")
    file(REMOVE_RECURSE "${dir}")
    message(FATAL_ERROR "the MoE llama file was not refused by name (${rc}): ${err}")
  endif()
endif()
# The `test` tokenizer has no text form: text commands say so, token-id commands run.
execute_process(COMMAND ${OFFGRAPH} run -m ${model} -p "hello" -n 1
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "tokenizer model .test. .* has no text form: such files run on token ids")
  file(REMOVE_RECURSE "${dir}")
  message(FATAL_ERROR "offgraph run on a 'test'-tokenizer file (${rc}): ${err}")
endif()
set(common --random 96 --seed ${SEED} --chunk 12 --greedy 32 --ctk ${KV} --ctv ${KV})
run_step(out ${OFFGRAPH} logits -m ${model} ${common} -o ${dir}/ours)
run_step(out ${PEER} -m ${model} ${common} -o ${dir}/theirs)
run_step(out ${COMPARE} ${dir}/ours ${dir}/theirs ${TOL})
message(STATUS "${ARCH} seed ${SEED}, KV ${KV}: ${out}")
file(REMOVE_RECURSE "${dir}")
