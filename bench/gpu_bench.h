// gradd-bench --device cuda: the GPU pieces of the bench, through the
// run-time-loaded driver (common/cuda/). Trainer side: filling and reading
// gradients that live in device memory, waiting for the stream. Reference
// (coordinator): the device's own in-place copy bandwidth measured in the
// same run, as the time a bandwidth-bound fused average of `ranks` buffers
// would take (it moves 2 x ranks x size bytes; a copy moves 2 x size), and
// the fused device kernel alone on buffers the bench owns.
// FAILED_PRECONDITION in builds without CUDA or on machines without a GPU.
#ifndef GRADD_BENCH_GPU_BENCH_H_
#define GRADD_BENCH_GPU_BENCH_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradd::bench {

// Makes GPU 0's primary context current on this thread (the trainer's
// context, as torch's would be).
absl::Status GpuInit();
// numel floats = v at device address `dev` (synchronous).
absl::Status GpuFill(void* dev, size_t numel, float v);
// numel floats from `dev` (waits for the legacy default stream first).
absl::StatusOr<std::vector<float>> GpuRead(const void* dev, size_t numel);
// Waits until the legacy default stream is idle.
absl::Status GpuSync();

struct GpuReference {
  double bound_us = 0;   // ranks x p50 of one size-byte device copy
  double kernel_us = 0;  // p50 of the fused average kernel alone
};
absl::StatusOr<GpuReference> MeasureGpuReference(uint64_t size, int ranks,
                                                 int iterations);

}  // namespace gradd::bench

#endif  // GRADD_BENCH_GPU_BENCH_H_
