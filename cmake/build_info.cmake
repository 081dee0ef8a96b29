# The build's identity for `cleave --version` and the cleave_build_info metric: the project's
# version, the commit it was built from ("unknown" outside a git checkout, e.g. a source
# tarball) and the build type. The commit is read when configuring; configuring runs again when
# the checkout's HEAD or the branch it names moves.
function(cleave_build_info out)
  set(commit unknown)
  find_package(Git QUIET)
  if(GIT_FOUND AND EXISTS ${CMAKE_SOURCE_DIR}/.git)
    execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
      OUTPUT_VARIABLE head OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0 AND head)
      set(commit ${head})
    endif()
    # HEAD, and the branch file it names (absent while the branch is only in packed-refs).
    execute_process(COMMAND ${GIT_EXECUTABLE} symbolic-ref -q HEAD WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
      OUTPUT_VARIABLE ref OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    foreach(what HEAD ${ref})
      execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --git-path ${what} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
        OUTPUT_VARIABLE path OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(path)
        get_filename_component(path ${path} ABSOLUTE BASE_DIR ${CMAKE_SOURCE_DIR})
        if(EXISTS ${path})
          set_property(DIRECTORY ${CMAKE_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${path})
        endif()
      endif()
    endforeach()
  endif()
  set(CLEAVE_BUILD_COMMIT ${commit})
  set(CLEAVE_BUILD_TYPE ${CMAKE_BUILD_TYPE})
  if(NOT CLEAVE_BUILD_TYPE)
    set(CLEAVE_BUILD_TYPE none)
  endif()
  configure_file(${CMAKE_SOURCE_DIR}/core/src/build_info.cpp.in ${out} @ONLY)
endfunction()
