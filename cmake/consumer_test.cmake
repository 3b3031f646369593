# ctest "cpp_consumer": install libfmha into a scratch prefix, build examples/cpp_consumer
# against it with find_package(fmha), and run it.
set(prefix ${FMHA_BUILD_DIR}/consumer-test/prefix)
set(build ${FMHA_BUILD_DIR}/consumer-test/build)
file(REMOVE_RECURSE ${FMHA_BUILD_DIR}/consumer-test)

function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}")
  endif()
endfunction()

run(${CMAKE_COMMAND} --install ${FMHA_BUILD_DIR} --prefix ${prefix} --config ${FMHA_CONFIG})
run(${CMAKE_COMMAND} -S ${FMHA_SOURCE_DIR}/examples/cpp_consumer -B ${build}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=${FMHA_CONFIG})
run(${CMAKE_COMMAND} --build ${build} --config ${FMHA_CONFIG})
if(EXISTS ${build}/${FMHA_CONFIG}/cpp_consumer${CMAKE_EXECUTABLE_SUFFIX})
  run(${build}/${FMHA_CONFIG}/cpp_consumer)
else()
  run(${build}/cpp_consumer)
endif()
