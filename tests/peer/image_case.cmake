# One image-prompt peer comparison: a synthetic Muse Glimmer text model and mmproj, two PNGs, a
# prompt with a media marker per image; `offgraph logits --mmproj --image` and the llama.cpp peer
# (peer_mtmd_logits, libmtmd) each tokenize, encode and decode it in the same chunks, then the
# comparer checks prompt positions (text ids, 0xFFFFFFFF per image row), greedy picks and every
# logits row (one per text position, then one per greedy decode); removes the files.
# -D: OFFGRAPH PEER COMPARE DIR NAME VOCAB TOL CHUNK [PYTHON]
if(NOT DEFINED PYTHON)
  set(PYTHON /usr/bin/python3) # python3-pil
endif()
set(text "${DIR}/${NAME}.text.gguf")
set(mmproj "${DIR}/${NAME}.mmproj.gguf")
set(image_a "${DIR}/${NAME}.a.png")
set(image_b "${DIR}/${NAME}.b.png")
set(ours "${DIR}/${NAME}.ours")
set(theirs "${DIR}/${NAME}.theirs")
file(MAKE_DIRECTORY "${DIR}")
include(${CMAKE_CURRENT_LIST_DIR}/../run_step.cmake)
set(CLEANUP "${text}" "${mmproj}" "${image_a}" "${image_b}" "${ours}" "${theirs}")
# ggml's OpenMP workers spin while they wait: on a busy 2-core machine that costs the peer ~10x
# in wall time. Waiting passively changes no result.
set(ENV{OMP_WAIT_POLICY} passive)

run_step(out ${OFFGRAPH} synth -o ${text} --arch muse-glimmer --preset tiny --type f32 --window 16
         --vocab ${VOCAB} --seed 3)
# The tiny preset's width (tools/synth/synth.h) is the projection's output width.
run_step(out ${OFFGRAPH} synth-mmproj -o ${mmproj} --embd-text 64 --seed 9)
# A small image (a few rows) and a tall one (hundreds of rows, several encoder windows).
run_step(out ${PYTHON} ${CMAKE_CURRENT_LIST_DIR}/make_image.py ${image_a} 100 70 1)
run_step(out ${PYTHON} ${CMAKE_CURRENT_LIST_DIR}/make_image.py ${image_b} 300 901 2)

set(prompt "Look at this: <__media__> and this <__media__> then describe them.")
set(inputs -m ${text} --mmproj ${mmproj} --image ${image_a} --image ${image_b} --prompt ${prompt}
           --chunk ${CHUNK} --greedy 16)
run_step(out ${OFFGRAPH} logits ${inputs} --ctk f32 --ctv f32 -o ${ours})
run_step(peer_out ${PEER} ${inputs} -t 2 -o ${theirs})
message(STATUS "${peer_out}")
run_step(out ${COMPARE} ${ours} ${theirs} ${TOL})
message(STATUS "${out}")
file(REMOVE ${CLEANUP})
