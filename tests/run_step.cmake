# run_step(OUT_VAR command...): runs a command for a test script; on failure removes the files
# listed in CLEANUP (a variable the script sets) and fails with the command's output.
function(run_step out_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    file(REMOVE ${CLEANUP})
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()
