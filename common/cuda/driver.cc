#include "common/cuda/driver.h"

#include <dlfcn.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace gradd::cuda {
namespace {

using GetProcAddressFn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult*);

absl::StatusOr<CudaDriver> LoadFrom(const char* library) {
  // RTLD_LOCAL: the driver's symbols stay out of the global namespace, so a
  // trainer's own CUDA runtime finds the same library but nothing of ours.
  void* handle = ::dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA driver on this machine: cannot load ", library,
                     " (", why != nullptr ? why : "unknown error", ")"));
  }
  // The handle is kept for the life of the process: the table points into it.
  auto get_proc = reinterpret_cast<GetProcAddressFn>(
      ::dlsym(handle, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA driver ", library,
        " has no cuGetProcAddress_v2; gradd needs a driver for CUDA ",
        kMinDriverVersion / 1000, ".", kMinDriverVersion % 1000 / 10,
        " or later"));
  }
  CudaDriver driver;
  std::string missing;
  auto resolve = [&](const char* name, void** slot) {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult r =
        get_proc(name, slot, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS ||
        *slot == nullptr) {
      *slot = nullptr;
      absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
    }
  };
#define GRADD_CUDA_DRIVER_FN(name) \
  resolve(#name, reinterpret_cast<void**>(&driver.name));
#include "common/cuda/driver_functions.inc"
#undef GRADD_CUDA_DRIVER_FN
  if (driver.cuDriverGetVersion != nullptr) {
    driver.cuDriverGetVersion(&driver.version);
  }
  if (driver.version != 0 && driver.version < kMinDriverVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA driver is version ", driver.version / 1000, ".",
        driver.version % 1000 / 10, "; gradd needs ", kMinDriverVersion / 1000,
        ".", kMinDriverVersion % 1000 / 10, " or later"));
  }
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA driver ", library, " (version ", driver.version,
                     ") lacks entry points gradd needs: ", missing));
  }
  CUresult init = driver.cuInit(0);
  if (init != CUDA_SUCCESS) {
    return absl::UnavailableError(
        absl::StrCat(CuCheck(driver, init, "cuInit").message(),
                     " (no usable GPU, or the driver and kernel module do not "
                     "match)"));
  }
  return driver;
}

}  // namespace

absl::StatusOr<const CudaDriver*> CudaDriver::Get() {
  static const absl::StatusOr<CudaDriver>* loaded =
      new absl::StatusOr<CudaDriver>(LoadFrom("libcuda.so.1"));
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

absl::StatusOr<CudaDriver> CudaDriver::Load(const char* library) {
  return LoadFrom(library);
}

absl::StatusCode CuStatusCode(CUresult result) {
  switch (result) {
    case CUDA_SUCCESS:
      return absl::StatusCode::kOk;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::StatusCode::kResourceExhausted;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_DEVICE:
      return absl::StatusCode::kInvalidArgument;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
      return absl::StatusCode::kUnavailable;
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_NOT_PERMITTED:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status CuCheck(const CudaDriver& driver, CUresult result,
                     absl::string_view context) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = nullptr;
  const char* text = nullptr;
  if (driver.cuGetErrorName != nullptr) driver.cuGetErrorName(result, &name);
  if (driver.cuGetErrorString != nullptr) {
    driver.cuGetErrorString(result, &text);
  }
  return absl::Status(
      CuStatusCode(result),
      absl::StrCat(context, ": ",
                   name != nullptr
                       ? name
                       : absl::StrCat("CUresult ", static_cast<int>(result)),
                   text != nullptr ? absl::StrCat(" (", text, ")") : ""));
}

}  // namespace gradd::cuda
