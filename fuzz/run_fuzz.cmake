# Runs one libFuzzer target for a bounded time (a ctest test of the build-fuzz tree, and
# `make fuzz-long`). The committed seed corpus and the regression inputs are read first (each
# must pass); new inputs go to WORK/corpus, crashes to WORK/artifacts. The figures of the run
# (executions, corpus, peak memory) are printed and kept in WORK/stats.txt for docs/reliability.md.
#
#   cmake -DFUZZER=<binary> -DNAME=<target> -DSECONDS=<n> -DWORK=<dir> -DSEEDS=<dir>
#         -DREGRESSIONS=<dir> [-DKEEP=ON] [-DEXTRA=<libFuzzer flags;...>] -P run_fuzz.cmake
#
# Without KEEP the working corpus starts empty each run, so a short run always starts from the
# committed seeds with the same -seed; with KEEP (the long run) it accumulates. The environment
# variable FUZZ_TIME (set by `make fuzz-long`) makes it a long run of that many seconds in
# WORK-long, with KEEP.
foreach(v FUZZER NAME SECONDS WORK SEEDS REGRESSIONS)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_fuzz.cmake: -D${v}= is required")
  endif()
endforeach()
# `make fuzz-long` sets FUZZ_TIME: a long run, in its own directory, keeping its corpus; with
# FUZZ_LONG_DIR (the Makefile's: outside the checkout) there, else beside the short run's.
set(LONG OFF)
if(DEFINED ENV{FUZZ_TIME} AND NOT "$ENV{FUZZ_TIME}" STREQUAL "")
  set(SECONDS $ENV{FUZZ_TIME})
  set(KEEP ON)
  set(LONG ON)
  if(DEFINED ENV{FUZZ_LONG_DIR} AND NOT "$ENV{FUZZ_LONG_DIR}" STREQUAL "")
    set(WORK "$ENV{FUZZ_LONG_DIR}/${NAME}")
  else()
    set(WORK "${WORK}-long")
  endif()
endif()
if(NOT KEEP)
  file(REMOVE_RECURSE "${WORK}/corpus")
endif()
file(MAKE_DIRECTORY "${WORK}/corpus" "${WORK}/artifacts")
set(dirs "${WORK}/corpus" "${SEEDS}")
if(IS_DIRECTORY "${REGRESSIONS}")
  list(APPEND dirs "${REGRESSIONS}")
endif()
string(TIMESTAMP started "%s")
execute_process(
  COMMAND "${FUZZER}" -max_total_time=${SECONDS} -seed=1 -timeout=10 -rss_limit_mb=2048
          -malloc_limit_mb=1024 -print_final_stats=1 -reload=0 -close_fd_mask=1
          "-artifact_prefix=${WORK}/artifacts/" ${EXTRA} ${dirs}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(TIMESTAMP finished "%s")
math(EXPR took "${finished} - ${started}")

set(execs "?")
set(peak "?")
set(corp "?")
set(cov "?")
if(out MATCHES "stat::number_of_executed_units: +([0-9]+)")
  set(execs ${CMAKE_MATCH_1})
endif()
if(out MATCHES "stat::peak_rss_mb: +([0-9]+)")
  set(peak ${CMAKE_MATCH_1})
endif()
# The last status line: "#N  DONE  cov: C ft: F corp: K/S ..."
string(REGEX MATCHALL "cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9]+[a-zA-Z]*" status "${out}")
if(status)
  list(GET status -1 last)
  string(REGEX REPLACE "cov: ([0-9]+).*" "\\1" cov "${last}")
  string(REGEX REPLACE ".*corp: ([0-9]+/[0-9]+[a-zA-Z]*)" "\\1" corp "${last}")
endif()
file(GLOB seeds "${SEEDS}/*")
file(GLOB regressions "${REGRESSIONS}/*")
list(FILTER seeds EXCLUDE REGEX "/[.][^/]*$") # .gitkeep
list(FILTER regressions EXCLUDE REGEX "/[.][^/]*$")
list(LENGTH seeds n_seeds)
list(LENGTH regressions n_regressions)
set(line "${NAME}: ${execs} executions in ${took} s, ${n_seeds} seeds + ${n_regressions} regression inputs replayed, corpus ${corp}, coverage ${cov} edges, peak RSS ${peak} MB")
file(WRITE "${WORK}/stats.txt" "${line}\n")
message("[fuzz] ${line}")
# A long run is recorded (fuzz/record.tsv, committed; fuzz/record.py sums it into
# docs/reliability.md): date, target, seconds, executions, corpus, coverage, peak RSS, crashes.
if(LONG AND DEFINED ENV{FUZZ_RECORD} AND NOT "$ENV{FUZZ_RECORD}" STREQUAL "")
  string(TIMESTAMP day "%Y-%m-%d" UTC)
  if(rc EQUAL 0)
    set(crashes 0)
  else()
    set(crashes 1)
  endif()
  file(APPEND "$ENV{FUZZ_RECORD}"
       "${day}\t${NAME}\t${took}\t${execs}\t${corp}\t${cov}\t${peak}\t${crashes}\n")
endif()
if(NOT rc EQUAL 0)
  # libFuzzer's report, the end of which names the input it saved.
  string(LENGTH "${out}" n)
  if(n GREATER 20000)
    math(EXPR from "${n} - 20000")
    string(SUBSTRING "${out}" ${from} 20000 out)
  endif()
  message("${out}")
  file(GLOB found "${WORK}/artifacts/*")
  message(FATAL_ERROR "[fuzz] ${NAME} failed (exit ${rc}); inputs saved: ${found}\n"
                      "Reproduce: ${FUZZER} <input>   (or the replay test of the main tree)\n"
                      "Then fix it and add the input to fuzz/regressions/${NAME}/.")
endif()
