# Installs the dev component of BUILD_DIR into WORK/prefix, configures and builds EXAMPLE
# against it in WORK/build, and runs the example. Any failing step fails the test.
file(REMOVE_RECURSE ${WORK})
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()
step(${CMAKE_COMMAND} --install ${BUILD_DIR} --component dev --prefix ${WORK}/prefix)
if(NOT EXISTS ${WORK}/prefix/include/cleave/core/data_source.h OR
   NOT EXISTS ${WORK}/prefix/lib/cmake/cleave/cleave-config.cmake)
  message(FATAL_ERROR "the headers or the package configuration were not installed")
endif()
step(${CMAKE_COMMAND} -S ${EXAMPLE} -B ${WORK}/build -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX}
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK}/prefix)
step(${CMAKE_COMMAND} --build ${WORK}/build)
step(${WORK}/build/example)
