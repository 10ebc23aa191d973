# `offgraph run --image` and `offgraph chat` with /image, end to end on a synthetic Muse Glimmer
# text model (the KJV vocabulary, which has the image tokens), a synthetic mmproj and two PNGs;
# greedy throughout:
#  - run: another image gives other text (raw prompt with <__media__>, and --chat);
#  - run's text is the text of `offgraph logits --greedy`'s picks on the same prompt and images;
#  - errors: --image without --mmproj, a missing file, markers and images differing in number;
#  - chat: /image then two turns (the second reuses the whole first prompt, image rows included);
#    /undo and /reset drop a message's images (the next prompts render without them), each answer
#    being run --chat's for the same message and image.
# -D: OFFGRAPH DETOKENIZE DIR VOCAB [PYTHON]
if(NOT DEFINED PYTHON)
  set(PYTHON /usr/bin/python3) # python3-pil
endif()
set(text "${DIR}/images-e2e.text.gguf")
set(mmproj "${DIR}/images-e2e.mmproj.gguf")
set(image_a "${DIR}/images-e2e.a.png")
set(image_b "${DIR}/images-e2e.b.png")
set(input "${DIR}/images-e2e.txt")
file(MAKE_DIRECTORY "${DIR}")
include(${CMAKE_CURRENT_LIST_DIR}/../run_step.cmake)
set(CLEANUP "${text}" "${mmproj}" "${image_a}" "${image_b}" "${input}")
set(ENV{OMP_WAIT_POLICY} passive) # ggml's idle workers spin otherwise

function(fail message)
  file(REMOVE ${CLEANUP})
  message(FATAL_ERROR "${message}")
endfunction()

# run_quiet(OUT ERR args...): a successful command's stdout and stderr.
function(run_quiet out_var err_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    fail("failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
endfunction()

# expect_error(PATTERN args...): the command exits non-zero with PATTERN on stderr.
function(expect_error pattern)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    fail("expected a failure: ${ARGN}\n${out}")
  endif()
  if(NOT err MATCHES "${pattern}")
    fail("expected '${pattern}' from ${ARGN}, got (${rc}):\n${err}")
  endif()
  message(STATUS "refused as expected: ${err}")
endfunction()

# stats(ERR PREFIX): PREFIX_computed, PREFIX_reused, PREFIX_generated from the statistics line.
function(stats err prefix)
  if(NOT err MATCHES "prompt: ([0-9]+) tokens computed \\(([0-9]+) reused\\)[^\n]*generated: ([0-9]+) tokens")
    fail("no statistics line:\n${err}")
  endif()
  set(${prefix}_computed ${CMAKE_MATCH_1} PARENT_SCOPE)
  set(${prefix}_reused ${CMAKE_MATCH_2} PARENT_SCOPE)
  set(${prefix}_generated ${CMAKE_MATCH_3} PARENT_SCOPE)
endfunction()

run_step(ignored ${OFFGRAPH} synth -o ${text} --arch muse-glimmer --preset tiny --type f32 --window 16
         --vocab ${VOCAB} --seed 3)
run_step(ignored ${OFFGRAPH} synth-mmproj -o ${mmproj} --embd-text 64 --seed 9)
run_step(ignored ${PYTHON} ${CMAKE_CURRENT_LIST_DIR}/../peer/make_image.py ${image_a} 100 70 1)
run_step(ignored ${PYTHON} ${CMAKE_CURRENT_LIST_DIR}/../peer/make_image.py ${image_b} 120 90 2)
set(model -m ${text} --mmproj ${mmproj})

# The image matters: a raw prompt with a marker, and a chat message.
set(raw -p "Describe <__media__> now" -n 8 --temp 0)
run_quiet(raw_a ignored ${OFFGRAPH} run ${model} --image ${image_a} ${raw})
run_quiet(raw_b ignored ${OFFGRAPH} run ${model} --image ${image_b} ${raw})
string(LENGTH "${raw_a}" n)
if(n LESS 5)
  fail("run printed almost nothing: '${raw_a}'")
endif()
if(raw_a STREQUAL raw_b)
  fail("two images, the same text: '${raw_a}'")
endif()
set(question -p "What is it?" --chat -n 12 --temp 0)
run_quiet(chat_a chat_a_err ${OFFGRAPH} run ${model} --image ${image_a} ${question})
run_quiet(chat_b ignored ${OFFGRAPH} run ${model} --image ${image_b} ${question})
run_quiet(chat_none ignored ${OFFGRAPH} run ${model} ${question})
if(chat_a STREQUAL chat_b OR chat_a STREQUAL chat_none)
  fail("run --chat: the image changed nothing:\n'${chat_a}'\n'${chat_b}'\n'${chat_none}'")
endif()
stats("${chat_a_err}" first)

# Two images inside text (markers mid-prompt): run's greedy text is that of logits' greedy picks.
set(two -p "Look at <__media__> and at <__media__>, then" --image ${image_a} --image ${image_b})
run_quiet(ours ignored ${OFFGRAPH} run ${model} ${two} -n 12 --temp 0 --ctk f32 --ctv f32)
run_quiet(picks ignored ${OFFGRAPH} logits ${model} ${two} --greedy 12)
if(NOT picks MATCHES "greedy:(( [0-9]+)+)")
  fail("no greedy picks from logits:\n${picks}")
endif()
string(STRIP "${CMAKE_MATCH_1}" ids)
separate_arguments(ids UNIX_COMMAND "${ids}")
run_quiet(theirs ignored ${DETOKENIZE} ${text} ${ids})
string(REGEX REPLACE "\n$" "" ours "${ours}") # run ends its output with a newline
if(NOT ours STREQUAL theirs)
  fail("run and logits' greedy picks differ:\nrun:    '${ours}'\nlogits: '${theirs}' (${ids})")
endif()
message(STATUS "run = logits' greedy picks: '${ours}'")

# Errors, each named.
expect_error("--image needs --mmproj" ${OFFGRAPH} run -m ${text} --image ${image_a} -p "x <__media__>")
expect_error("cannot read the image ${DIR}/nothere.png"
             ${OFFGRAPH} run ${model} --image ${DIR}/nothere.png -p "x <__media__>")
expect_error("the prompt has 2 image places and the request 1 images"
             ${OFFGRAPH} run ${model} --image ${image_a} -p "<__media__> and <__media__>")
expect_error("the prompt has 1 image places and the request 2 images"
             ${OFFGRAPH} run ${model} --image ${image_a} --image ${image_b} -p "<__media__> only")
expect_error("the prompt has 1 image places and the request 0 images"
             ${OFFGRAPH} run ${model} -p "<__media__> without an image")

# chat: an image, then two turns; the second prompt reuses the whole first one.
file(WRITE "${input}" "/image ${image_a}\nWhat is it?\nAnd again?\n")
execute_process(COMMAND ${OFFGRAPH} chat ${model} -n 12 --temp 0 INPUT_FILE "${input}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  fail("chat failed (${rc}):\n${out}\n${err}")
endif()
if(NOT err MATCHES "image [^\n]*images-e2e.a.png: 100x70, ([0-9]+) rows\n")
  fail("/image was not reported:\n${err}")
endif()
set(rows ${CMAKE_MATCH_1})
string(FIND "${out}" "${chat_a}" at)
if(NOT at EQUAL 0)
  fail("chat's first answer is not run --chat's for the same image:\nchat: '${out}'\nrun:  '${chat_a}'")
endif()
stats("${err}" session)
math(EXPR both "${first_generated} + 1")
if(session_generated LESS both)
  fail("the second turn generated nothing:\n${out}\n${err}")
endif()
if(session_reused LESS first_computed OR NOT session_reused GREATER rows)
  fail("the second turn reused ${session_reused} prompt tokens; the first prompt has ${first_computed} (the image ${rows} rows)")
endif()
message(STATUS "chat: image of ${rows} rows; the second turn reused ${session_reused} tokens (the first prompt: ${first_computed})")

# /undo and /reset drop the images of the messages they remove: each prompt after them holds only
# its own images (a leftover would be an image without its place), and answers as run --chat.
file(WRITE "${input}" "/image ${image_a}\nWhat is it?\n/undo\nWhat is it?\n/undo\n/image ${image_b}\nWhat is it?\n/image ${DIR}/nothere.png\n/reset\n/image ${image_a}\nWhat is it?\n")
execute_process(COMMAND ${OFFGRAPH} chat ${model} -n 12 --temp 0 INPUT_FILE "${input}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE ${CLEANUP})
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "chat failed (${rc}):\n${out}\n${err}")
endif()
# The image file's own error; the second /image of a.png comes from the encoder's cache.
if(NOT err MATCHES "cannot read the image ${DIR}/nothere.png")
  message(FATAL_ERROR "/image of a missing file was not reported by name:\n${err}")
endif()
if(NOT err MATCHES "images-e2e.a.png: 100x70, ${rows} rows \\(cached\\)")
  message(FATAL_ERROR "the same image again was not served from the cache:\n${err}")
endif()
if(err MATCHES "image places")
  message(FATAL_ERROR "a removed message's image outlived it:\n${err}")
endif()
set(expected "${chat_a}${chat_none}${chat_b}${chat_a}")
if(NOT out STREQUAL expected)
  message(FATAL_ERROR "chat after /undo and /reset answered otherwise than run --chat:\nchat:     '${out}'\nexpected: '${expected}'\n${err}")
endif()
message(STATUS "chat after /undo and /reset: ${out}")
