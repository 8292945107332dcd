# Precompiled headers for the libraries with many files (GRADD_PCH, default
# ON with GCC). Almost every file of the daemon and the client library
# parses the same large third-party headers: libstdc++, Abseil, protobuf,
# gRPC, spdlog/fmt. With a PCH each library parses them once and its files
# load the result, which cut the demo's build (scripts/demo: gradd, graddctl,
# the C++ trainer, the Python module) by about a fifth of its CPU time.
#
# What goes in: only headers of installed packages and the generated
# gradd/v1/*.pb.h, never the project's own headers, so a PCH is rebuilt only
# when a package or a .proto changes. Every file still includes what it
# uses; a PCH only makes that cheaper, and the tree builds with
# -DGRADD_PCH=OFF exactly as before (same flags, same object code).
#
# Which targets: those where it pays. A PCH costs 4-8 s of CPU to build and
# 110-190 MB of disk per target, and saves about 1 s per file that uses it,
# so libraries of 3-4 files and one-file executables go without (gradd's
# main.cc cannot reuse gradd_server's: executables are compiled -fPIE,
# libraries -fPIC, and GCC rejects a PCH built with the other). Each target
# gets its own PCH, built with its own flags (sanitizers, defines), so
# build-asan and the test targets that link these libraries are unaffected.
# Applied by target name from the top-level CMakeLists.txt, after every
# add_subdirectory(); a target that does not exist is skipped.
#
# Only GCC is measured (Debian's g++ builds everything but the fuzz targets,
# which scripts/test builds with clang); other compilers default to OFF.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  set(_gradd_pch_default ON)
else()
  set(_gradd_pch_default OFF)
endif()
option(GRADD_PCH "Precompile the heavy third-party headers (GCC)"
       ${_gradd_pch_default})

set(_gradd_pch_std
  <algorithm> <atomic> <chrono> <cstddef> <cstdint> <cstring> <deque>
  <functional> <map> <memory> <optional> <string> <string_view> <thread>
  <utility> <vector>)
set(_gradd_pch_absl
  "absl/base/thread_annotations.h" "absl/container/flat_hash_map.h"
  "absl/functional/any_invocable.h" "absl/status/status.h"
  "absl/status/statusor.h" "absl/strings/str_cat.h"
  "absl/strings/str_join.h" "absl/strings/string_view.h"
  "absl/synchronization/mutex.h" "absl/time/clock.h" "absl/time/time.h")
set(_gradd_pch_protobuf
  "google/protobuf/message.h" "google/protobuf/generated_message_reflection.h"
  "google/protobuf/wire_format.h" "google/protobuf/descriptor.h")
set(_gradd_pch_grpc "grpcpp/grpcpp.h")
set(_gradd_pch_spdlog "spdlog/spdlog.h")
set(_gradd_pch_pybind11
  "pybind11/pybind11.h" "pybind11/stl.h" "pybind11/numpy.h")

# gradd_pch(<target> <set or header>...): a set is one of std, absl,
# protobuf, grpc, spdlog, pybind11; anything else is a header to add as it is. A
# generated proto header (gradd/v1/NAME.pb.h) is added only while
# proto/gradd/v1/NAME.proto exists.
function(gradd_pch target)
  if(NOT GRADD_PCH OR NOT TARGET ${target})
    return()
  endif()
  set(headers)
  foreach(item IN LISTS ARGN)
    if(DEFINED _gradd_pch_${item})
      list(APPEND headers ${_gradd_pch_${item}})
    elseif(item MATCHES "^gradd/v1/(.+)\\.pb\\.h$")
      if(EXISTS ${PROJECT_SOURCE_DIR}/proto/gradd/v1/${CMAKE_MATCH_1}.proto)
        list(APPEND headers "${item}")
      endif()
    else()
      list(APPEND headers "${item}")
    endif()
  endforeach()
  # C++ files only (a target may hold CUDA or C sources too).
  list(TRANSFORM headers REPLACE "^(.+)$" "$<$<COMPILE_LANGUAGE:CXX>:\\1>")
  target_precompile_headers(${target} PRIVATE ${headers})
endfunction()

function(gradd_use_pch)
  gradd_pch(gradd_server std absl protobuf grpc spdlog
    "gradd/v1/node.pb.h" "gradd/v1/config.pb.h")
  # The engine's components (gradd_engine_observe has 4 files: none) and
  # the base they are built on.
  gradd_pch(gradd_server_base std absl protobuf spdlog "gradd/v1/config.pb.h")
  foreach(component formation reduce job manager)
    gradd_pch(gradd_engine_${component} std absl protobuf
      "gradd/v1/node.pb.h")
  endforeach()
  gradd_pch(gradd_client std absl protobuf)
  gradd_pch(gradd_common std absl)
  gradd_pch(gradd_proto std absl protobuf grpc)
  gradd_pch(gradd_rendezvous std absl protobuf grpc)
  gradd_pch(gradd_auth std absl grpc)
  gradd_pch(gradd_python std absl pybind11)
endfunction()
