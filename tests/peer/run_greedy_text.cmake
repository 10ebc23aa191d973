# `offgraph run --temp 0` prints the same text as llama.cpp's greedy continuation of the same
# prompt on the same file (each side with its own tokenizer and detokenizer).
set(model "${DIR}/run-greedy.gguf")
file(MAKE_DIRECTORY "${DIR}")
include(${CMAKE_CURRENT_LIST_DIR}/../run_step.cmake)
set(CLEANUP "${model}")
run_step(ignored ${OFFGRAPH} synth --preset small --type f32 --seed 21 -o ${model})
set(prompt "The quick brown fox jumps over the lazy dog. Ünïcödé, 中文, and numbers 12345 follow")
run_step(ours ${OFFGRAPH} run -m ${model} -p ${prompt} -n 40 --temp 0 -c 256)
run_step(ignored ${PEER} -m ${model} --prompt ${prompt} --chunk 64 --greedy 40 --ctk f16 --ctv f16 -o ${DIR}/greedy.lg
    --text-out ${DIR}/greedy.txt)
file(READ ${DIR}/greedy.txt theirs)
file(REMOVE "${model}" ${DIR}/greedy.lg ${DIR}/greedy.txt)
string(REGEX REPLACE "\n$" "" ours "${ours}") # run ends its output with a newline
if(NOT ours STREQUAL theirs)
  message(FATAL_ERROR "greedy text differs:\noffgraph:  '${ours}'\nllama.cpp: '${theirs}'")
endif()
string(LENGTH "${ours}" n)
message(STATUS "identical greedy text (${n} bytes): ${ours}")
