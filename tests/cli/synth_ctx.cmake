# `offgraph synth --ctx N` writes N as the model's training context (inspect sizes its KV figures
# by it), and a context that is not positive is refused with an error naming the option.
set(model "${DIR}/synth-ctx.gguf")
file(MAKE_DIRECTORY "${DIR}")
include(${CMAKE_CURRENT_LIST_DIR}/../run_step.cmake)
set(CLEANUP "${model}")
run_step(ignored ${OFFGRAPH} synth --preset tiny --meta-only --ctx 12345 -o ${model})
run_step(shown ${OFFGRAPH} inspect ${model})
file(REMOVE "${model}")
if(NOT shown MATCHES "KV at 12345 tokens")
  message(FATAL_ERROR "inspect does not report the 12345-token training context:\n${shown}")
endif()
execute_process(COMMAND ${OFFGRAPH} synth --preset tiny --meta-only --ctx -5 -o ${model}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--ctx")
  message(FATAL_ERROR "synth --ctx -5 was not refused by name (exit ${rc}): ${err}")
endif()
