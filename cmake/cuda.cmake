# GRADD_WITH_CUDA (AUTO | ON | OFF) -> GRADD_HAVE_CUDA, the CUDA language and
# CUDA::toolkit headers. Sets GRADD_HAVE_CUDA (bool) for the subdirectories;
# targets that hold GPU code add the compile definition GRADD_HAVE_CUDA=1.
string(TOUPPER "${GRADD_WITH_CUDA}" _gradd_cuda_mode)
if(_gradd_cuda_mode MATCHES "^(1|TRUE|YES|Y)$")
  set(_gradd_cuda_mode ON)
elseif(_gradd_cuda_mode MATCHES "^(0|FALSE|NO|N)$")
  set(_gradd_cuda_mode OFF)
endif()
if(NOT _gradd_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "GRADD_WITH_CUDA is '${GRADD_WITH_CUDA}'; use AUTO, ON or OFF")
endif()

set(GRADD_HAVE_CUDA OFF)
if(NOT _gradd_cuda_mode STREQUAL "OFF")
  # Our machines keep the toolkit under /usr/local/cuda without putting nvcc
  # on PATH; an explicit CMAKE_CUDA_COMPILER or $CUDACXX wins.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
     AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # sm_90 machine code (H100/H200) plus compute_90 PTX for later GPUs.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90-real 90-virtual)
    endif()
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    find_package(CUDAToolkit)
  endif()
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
    find_path(GRADD_NCCL_INCLUDE_DIR nccl.h
      HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda-13.0/include
            /usr/local/cuda/include /usr/include)
    if(NOT GRADD_NCCL_INCLUDE_DIR)
      # The daemon loads libnccl.so.2 at run time; only its header is needed
      # here, and without it the multi-GPU backend cannot be compiled.
      if(_gradd_cuda_mode STREQUAL "ON")
        message(FATAL_ERROR "GRADD_WITH_CUDA=ON but nccl.h was not found "
                            "(set GRADD_NCCL_INCLUDE_DIR)")
      endif()
      message(STATUS "gradd: CUDA toolkit found but no nccl.h: CUDA off")
    else()
      set(GRADD_HAVE_CUDA ON)
    endif()
  elseif(_gradd_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "GRADD_WITH_CUDA=ON but no CUDA toolkit (nvcc) was "
                        "found; install one or configure with "
                        "-DGRADD_WITH_CUDA=AUTO or OFF")
  endif()
endif()

if(GRADD_HAVE_CUDA)
  message(STATUS "gradd: CUDA ${CUDAToolkit_VERSION} (${CMAKE_CUDA_COMPILER}, "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES}), nccl.h in "
                 "${GRADD_NCCL_INCLUDE_DIR}")
else()
  message(STATUS "gradd: CUDA off (GRADD_WITH_CUDA=${GRADD_WITH_CUDA})")
endif()
