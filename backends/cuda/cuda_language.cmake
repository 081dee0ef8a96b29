# Enables the CUDA language for the whole build when CLEAVE_WITH_CUDA is not OFF and nvcc is
# found. Included from the top-level CMakeLists: CMake wants enable_language(CUDA) in the
# directory common to every target that compiles or links CUDA code.
set(CLEAVE_CUDA_LANGUAGE FALSE)
string(TOUPPER "${CLEAVE_WITH_CUDA}" _cleave_cuda_opt)
if(NOT _cleave_cuda_opt STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler")
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Hopper (H100/H200): sm_90 machine code plus compute_90 PTX that the driver can compile
    # for newer GPUs.
    set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures")
    # CMake 3.25 knows no C++20 for CUDA: the .cu files are C++17.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(CMAKE_CUDA_EXTENSIONS OFF)
    enable_language(CUDA)
    set(CLEAVE_CUDA_LANGUAGE TRUE)
  elseif(_cleave_cuda_opt STREQUAL "ON")
    message(FATAL_ERROR "CLEAVE_WITH_CUDA=ON but no CUDA compiler found (set CUDACXX or CMAKE_CUDA_COMPILER)")
  else()
    message(STATUS "cleave: CLEAVE_WITH_CUDA=AUTO: no CUDA compiler found, cuda backend disabled")
  endif()
endif()
