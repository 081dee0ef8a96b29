# What an app built outside this tree needs: the public headers, the static libraries and a
# CMake package (find_package(cleave CONFIG) -> cleave::cleave, or cleave::core, cleave::device...).
# All of it is the component `dev`, left out of a plain install and so of the Debian package:
#   cmake --install BUILD --component dev --prefix PREFIX
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_targets cleave_warnings cleave_core cleave_split cleave_backends)
foreach(b onednn vulkan cuda)
  if(TARGET cleave_backend_${b})
    list(APPEND _targets cleave_backend_${b})
  endif()
endforeach()
set(_include_dirs core/include split/include backends/include)
if(CLEAVE_NET_FOUND)
  list(APPEND _targets cleave_asio cleave_metrics cleave_wire cleave_transport cleave_privacy cleave_protocol cleave_runtime cleave_device
       cleave_edge cleave_server cleave_federation)
  list(APPEND _include_dirs metrics/include transport/include privacy/include protocol/include runtime/include
       device/include edge/include server/include federation/include)
endif()

# Everything an app may link, under one name.
add_library(cleave_all INTERFACE)
if(CLEAVE_NET_FOUND)
  target_link_libraries(cleave_all INTERFACE cleave_federation)
else()
  target_link_libraries(cleave_all INTERFACE cleave_backends cleave_split)
endif()
set_target_properties(cleave_all PROPERTIES EXPORT_NAME cleave)
list(APPEND _targets cleave_all)
foreach(t ${_targets})
  string(REGEX REPLACE "^cleave_" "" _name ${t})
  if(NOT t STREQUAL "cleave_all")
    set_target_properties(${t} PROPERTIES EXPORT_NAME ${_name})
  endif()
endforeach()

install(TARGETS ${_targets} EXPORT cleave-targets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev EXCLUDE_FROM_ALL
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
foreach(d ${_include_dirs})
  install(DIRECTORY ${CMAKE_SOURCE_DIR}/${d}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
    COMPONENT dev EXCLUDE_FROM_ALL FILES_MATCHING PATTERN "*.h")
endforeach()
if(CLEAVE_NET_FOUND)
  install(DIRECTORY ${CLEAVE_WIRE_GENERATED_DIR}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
    COMPONENT dev EXCLUDE_FROM_ALL FILES_MATCHING PATTERN "*.h")
endif()

set(_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/cleave)
install(EXPORT cleave-targets NAMESPACE cleave:: DESTINATION ${_cmake_dir} COMPONENT dev EXCLUDE_FROM_ALL)
set(CLEAVE_CONFIG_NET ${CLEAVE_NET_FOUND})
set(CLEAVE_CONFIG_ONEDNN ${CLEAVE_HAVE_ONEDNN})
set(CLEAVE_CONFIG_VULKAN ${CLEAVE_HAVE_VULKAN})
set(CLEAVE_CONFIG_CUDA ${CLEAVE_HAVE_CUDA})
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/cleave-config.cmake.in
  ${CMAKE_BINARY_DIR}/cleave-config.cmake INSTALL_DESTINATION ${_cmake_dir})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cleave-config-version.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cleave-config.cmake ${CMAKE_BINARY_DIR}/cleave-config-version.cmake
  DESTINATION ${_cmake_dir} COMPONENT dev EXCLUDE_FROM_ALL)
