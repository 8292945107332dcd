// The device reducers: common/reduce.h's kernels for buffers in GPU memory,
// enqueued on a stream (nothing here waits for the GPU). Same numerics as
// the CPU kernels (see device_reduce_kernels.cu), so tests compare bits.
//
//   DeviceFusedAverage            n trainers sharing one GPU: average in
//                                 place into every buffer (one pass)
//   DeviceSumToAccumulator        multi-node: the node's partial sum in
//                                 AccumulatorDType (float for 16-bit types)
//   DeviceScatterFromAccumulator  multi-node write-back: acc / divisor into
//                                 every buffer
//
// INVALID_ARGUMENT for n outside 1..kMaxDeviceBuffers or a divisor that is
// not positive; INTERNAL / UNAVAILABLE with the CUDA error's name when the
// launch fails, prefixed with `context` (job, rank, device and bucket).
#ifndef GRADD_COMMON_CUDA_DEVICE_REDUCE_H_
#define GRADD_COMMON_CUDA_DEVICE_REDUCE_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace gradd::cuda {

inline constexpr int kMaxDeviceBuffers = 16;

[[nodiscard]] absl::Status DeviceFusedAverage(DType dtype, void* const* buffers,
                                              int n, size_t count,
                                              double divisor, void* stream,
                                              absl::string_view context);
[[nodiscard]] absl::Status DeviceSumToAccumulator(DType dtype,
                                                  const void* const* srcs,
                                                  int n, void* acc,
                                                  size_t count, void* stream,
                                                  absl::string_view context);
[[nodiscard]] absl::Status DeviceScatterFromAccumulator(
    DType dtype, const void* acc, double divisor, void* const* outs, int n,
    size_t count, void* stream, absl::string_view context);
// A device-to-device copy on `stream` (the benchmark's bandwidth reference).
[[nodiscard]] absl::Status DeviceCopy(void* dst, const void* src, size_t bytes,
                                      void* stream, absl::string_view context);

}  // namespace gradd::cuda

#endif  // GRADD_COMMON_CUDA_DEVICE_REDUCE_H_
