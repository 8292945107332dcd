#include "common/cuda/device_reduce.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/cuda/device_reduce_kernels.h"

namespace gradd::cuda {
namespace {

static_assert(kMaxDeviceBuffers == kernels::kMaxBuffers);

absl::Status CheckArgs(int n, double divisor, absl::string_view context) {
  if (n < 1 || n > kMaxDeviceBuffers) {
    return absl::InvalidArgumentError(
        absl::StrCat(context, ": ", n, " buffers; a device reduce takes 1..",
                     kMaxDeviceBuffers));
  }
  if (!(divisor > 0) || !std::isfinite(divisor)) {
    return absl::InvalidArgumentError(
        absl::StrCat(context, ": divisor ", divisor, " is not positive"));
  }
  return absl::OkStatus();
}

absl::Status FromCuda(int error, absl::string_view context,
                      absl::string_view what) {
  if (error == 0) return absl::OkStatus();
  // cudaErrorLaunchFailure (719) and friends leave the context unusable:
  // the job must fail; a bad launch configuration is our bug.
  const absl::StatusCode code = error >= 700 && error < 800
                                    ? absl::StatusCode::kUnavailable
                                    : absl::StatusCode::kInternal;
  return absl::Status(
      code, absl::StrCat(context, ": ", what, ": ", kernels::ErrorName(error),
                         " (", kernels::ErrorString(error), ")"));
}

}  // namespace

absl::Status DeviceFusedAverage(DType dtype, void* const* buffers, int n,
                                size_t count, double divisor, void* stream,
                                absl::string_view context) {
  if (absl::Status s = CheckArgs(n, divisor, context); !s.ok()) return s;
  return FromCuda(kernels::LaunchFusedAverage(static_cast<int>(dtype), buffers,
                                              n, count, divisor, stream),
                  context, "fused average kernel");
}

absl::Status DeviceSumToAccumulator(DType dtype, const void* const* srcs, int n,
                                    void* acc, size_t count, void* stream,
                                    absl::string_view context) {
  if (absl::Status s = CheckArgs(n, 1.0, context); !s.ok()) return s;
  return FromCuda(kernels::LaunchSumToAccumulator(static_cast<int>(dtype), srcs,
                                                  n, acc, count, stream),
                  context, "sum kernel");
}

absl::Status DeviceScatterFromAccumulator(DType dtype, const void* acc,
                                          double divisor, void* const* outs,
                                          int n, size_t count, void* stream,
                                          absl::string_view context) {
  if (absl::Status s = CheckArgs(n, divisor, context); !s.ok()) return s;
  return FromCuda(
      kernels::LaunchScatterFromAccumulator(static_cast<int>(dtype), acc,
                                            divisor, outs, n, count, stream),
      context, "scatter kernel");
}

absl::Status DeviceCopy(void* dst, const void* src, size_t bytes, void* stream,
                        absl::string_view context) {
  return FromCuda(kernels::LaunchCopy(dst, src, bytes, stream), context,
                  "device copy");
}

}  // namespace gradd::cuda
