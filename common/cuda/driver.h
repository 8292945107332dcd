// The CUDA driver API, loaded at run time: dlopen("libcuda.so.1") and
// cuGetProcAddress, so gradd's binaries link no libcuda and start on
// machines without a driver (they answer CUDA requests with a clear error
// instead). Every entry point gradd uses is one member of CudaDriver.
//
// CudaDriver::Get() loads the driver once per process (thread-safe) and
// returns the same table or the same error afterwards:
//   FAILED_PRECONDITION  no libcuda.so.1 (no driver on this machine), a
//                        driver older than kMinDriverVersion, or one that
//                        lacks an entry point gradd needs (named);
//   UNAVAILABLE          cuInit failed (e.g. no device, driver/kernel
//                        module mismatch), with the driver's error name.
// CuCheck turns a CUresult into an absl::Status with a caller-supplied
// context ("job 'j' rank 1 device 0 bucket 3: cuMemCreate"); callers name
// job, rank, device and bucket there.
#ifndef GRADD_COMMON_CUDA_DRIVER_H_
#define GRADD_COMMON_CUDA_DRIVER_H_

#include <cuda.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradd::cuda {

// CUDA 12.0: cuMem POSIX-fd export and the entry points below as declared.
inline constexpr int kMinDriverVersion = 12000;

struct CudaDriver {
  int version = 0;  // cuDriverGetVersion, e.g. 13000

#define GRADD_CUDA_DRIVER_FN(name) decltype(&::name) name = nullptr;
#include "common/cuda/driver_functions.inc"
#undef GRADD_CUDA_DRIVER_FN

  // The process-wide table, loaded on first use.
  static absl::StatusOr<const CudaDriver*> Get();
  // Loads a table from `library` (tests pass a missing path). Not cached.
  static absl::StatusOr<CudaDriver> Load(const char* library);
};

// OK for CUDA_SUCCESS; otherwise `code_for_error` (INTERNAL unless the
// result says otherwise: CUDA_ERROR_OUT_OF_MEMORY → RESOURCE_EXHAUSTED,
// CUDA_ERROR_INVALID_VALUE/INVALID_HANDLE → INVALID_ARGUMENT, a lost or
// failed device → UNAVAILABLE) with "<context>: <name> (<text>)".
absl::Status CuCheck(const CudaDriver& driver, CUresult result,
                     absl::string_view context);
// The status code gradd uses for a CUresult (see CuCheck).
absl::StatusCode CuStatusCode(CUresult result);

}  // namespace gradd::cuda

#endif  // GRADD_COMMON_CUDA_DRIVER_H_
