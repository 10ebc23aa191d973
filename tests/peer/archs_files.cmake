# archs_files(NAME ARCH_REGEX): a fresh folder `dir` = DIR/archs-NAME (removed again by run_step on
# failure) holding the files test-llama-archs (GEN) writes for the architectures matching the
# regex with seed SEED: ARCH-dense.gguf (and llama-moe.gguf for llama).
include(${CMAKE_CURRENT_LIST_DIR}/../run_step.cmake)
macro(archs_files name arch_regex)
  set(dir "${DIR}/archs-${name}")
  file(REMOVE_RECURSE "${dir}")
  file(MAKE_DIRECTORY "${dir}")
  set(CLEANUP "${dir}")
  run_step(out ${GEN} -a "${arch_regex}" -s ${SEED} -o ${dir})
endmacro()
