# `offgraph inspect` on a metadata-only file with the real Muse Glimmer 30B hyperparameters:
# 13 flat and 39 ring layers (2,048 + 32 rows), ~1.83 GB of KV at 131,072 tokens against ~7 GB for
# full caches: 13 x 131,072 + 39 x 2,080 rows of 1 KiB.
set(file "${DIR}/muse-glimmer-30b-meta.gguf")
file(MAKE_DIRECTORY "${DIR}")
execute_process(COMMAND ${OFFGRAPH} synth --preset 30b -o ${file} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "synth failed: ${out}${err}")
endif()
execute_process(COMMAND ${OFFGRAPH} inspect ${file} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE "${file}")
message(STATUS "${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "inspect failed: ${err}")
endif()
foreach(want "metadata-only file" "27854794240" "13 flat, 39 ring (K f16" "offgraph 1.70 GiB (1.828 GB)"
             "full cache on every layer 6.50 GiB (6.979 GB)" "f32 x 313 q4_K x 418")
  string(FIND "${out}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "inspect output lacks '${want}'")
  endif()
endforeach()
