# One peer comparison: generate a model, run `offgraph logits` and the llama.cpp peer on the same
# prompt with the same chunks, compare greedy picks and every logits row, remove the files.
# -D: OFFGRAPH PEER COMPARE DIR NAME SYNTH (;-list) KV TOL CHUNK ORDER [TEXT] [ATTENTION] [AMX on|off]
set(model "${DIR}/${NAME}.gguf")
set(ours "${DIR}/${NAME}.ours")
set(theirs "${DIR}/${NAME}.theirs")
file(MAKE_DIRECTORY "${DIR}")
include(${CMAKE_CURRENT_LIST_DIR}/../run_step.cmake)
set(CLEANUP "${model}" "${ours}" "${theirs}")
run_step(out ${OFFGRAPH} synth -o ${model} ${SYNTH})
set(common --chunk ${CHUNK} --greedy 64 --ctk ${KV} --ctv ${KV})
set(kernels)
set(ties)
if(AMX STREQUAL "on")
  # AMX sums blocks in another order: greedy may part at a near tie. Not where this CPU has no
  # AMX (offgraph --list-devices says): both sides then multiply with ggml's kernels.
  execute_process(COMMAND ${OFFGRAPH} serve --list-devices OUTPUT_VARIABLE listing)
  if(listing MATCHES "\\(AMX tiles for q8_0\\)")
    set(ties --near-ties)
  endif()
else()
  set(kernels --no-amx) # ggml's multiplies, as llama.cpp's
endif()
if(NOT DEFINED ATTENTION)
  set(ATTENTION grouped)
endif()
if(DEFINED TEXT)
  # A text prompt: each side tokenizes it with its own tokenizer, so the prompt ids are compared too.
  run_step(out ${OFFGRAPH} logits -m ${model} --prompt ${TEXT} ${common} ${kernels} --ring-order ${ORDER} --attention ${ATTENTION} -o ${ours})
  run_step(out ${PEER} -m ${model} --prompt ${TEXT} ${common} -o ${theirs})
else()
  run_step(out ${OFFGRAPH} logits -m ${model} --random 64 --seed 9 ${common} ${kernels} --ring-order ${ORDER} --attention ${ATTENTION} -o ${ours})
  run_step(out ${PEER} -m ${model} --random 64 --seed 9 ${common} -o ${theirs})
endif()
run_step(out ${COMPARE} ${ours} ${theirs} ${TOL} ${ties})
message(STATUS "${out}")
file(REMOVE "${model}" "${ours}" "${theirs}")
