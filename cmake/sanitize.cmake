# Sanitizer and fuzzing builds of offgraph's own code (ggml keeps its own flags).
#
#   -DOFFGRAPH_SANITIZE=address,undefined   every offgraph target compiled and linked with these
#                                           sanitizers (gcc or clang); `make test-asan` uses it
#   -DOFFGRAPH_FUZZ=ON                      clang only: our code gets -fsanitize=fuzzer-no-link plus
#                                           address,undefined, and fuzz/ builds the libFuzzer
#                                           targets (`make test` builds them in build-fuzz)
set(OFFGRAPH_SANITIZE "" CACHE STRING "Sanitizers for offgraph's own code, e.g. address,undefined")
option(OFFGRAPH_FUZZ "Build the libFuzzer targets in fuzz/ (needs clang)" OFF)

if(OFFGRAPH_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "OFFGRAPH_FUZZ needs clang (libFuzzer); configure with CC=clang CXX=clang++")
  endif()
  if(NOT OFFGRAPH_SANITIZE)
    set(OFFGRAPH_SANITIZE "address,undefined")
  endif()
endif()

if(OFFGRAPH_SANITIZE)
  # Every finding stops the program: a test that passes with a report printed is no test.
  set(_offgraph_san -fsanitize=${OFFGRAPH_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC's flow analysis sees through the sanitizers' instrumentation badly and reports
    # maybe-uninitialized in libstdc++'s own headers (<regex>, <functional>); the plain build keeps
    # the warning.
    list(APPEND _offgraph_san -Wno-maybe-uninitialized)
  endif()
  target_compile_options(offgraph_flags INTERFACE ${_offgraph_san} -g)
  target_link_options(offgraph_flags INTERFACE -fsanitize=${OFFGRAPH_SANITIZE})
  message(STATUS "offgraph: sanitizers ${OFFGRAPH_SANITIZE} on offgraph's own code")
endif()
if(OFFGRAPH_FUZZ)
  target_compile_options(offgraph_flags INTERFACE -fsanitize=fuzzer-no-link)
endif()
