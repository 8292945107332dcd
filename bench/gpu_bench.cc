#include "bench/gpu_bench.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

#if GRADD_HAVE_CUDA
#include "common/cuda/cumem_allocator.h"
#include "common/cuda/device_reduce.h"
#include "common/cuda/driver.h"
#include "common/cuda/owners.h"
#include "common/dtype.h"
#endif

namespace gradd::bench {

#if GRADD_HAVE_CUDA
namespace {

double P50(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double NowUs() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::Status GpuInit() {
  ASSIGN_OR_RETURN(const cuda::CudaDriver* d, cuda::CudaDriver::Get());
  return cuda::UseDevice(*d, 0, "gradd-bench");
}

absl::Status GpuFill(void* dev, size_t numel, float v) {
  ASSIGN_OR_RETURN(const cuda::CudaDriver* d, cuda::CudaDriver::Get());
  std::vector<float> host(numel, v);
  RETURN_IF_ERROR(
      cuda::CuCheck(*d,
                    d->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dev),
                                     reinterpret_cast<CUdeviceptr>(host.data()),
                                     numel * sizeof(float), nullptr),
                    "gradd-bench: fill"));
  return cuda::CuCheck(*d, d->cuStreamSynchronize(nullptr),
                       "gradd-bench: fill");
}

absl::StatusOr<std::vector<float>> GpuRead(const void* dev, size_t numel) {
  ASSIGN_OR_RETURN(const cuda::CudaDriver* d, cuda::CudaDriver::Get());
  std::vector<float> host(numel);
  RETURN_IF_ERROR(
      cuda::CuCheck(*d,
                    d->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(host.data()),
                                     reinterpret_cast<CUdeviceptr>(dev),
                                     numel * sizeof(float), nullptr),
                    "gradd-bench: read"));
  RETURN_IF_ERROR(
      cuda::CuCheck(*d, d->cuStreamSynchronize(nullptr), "gradd-bench: read"));
  return host;
}

absl::Status GpuSync() {
  ASSIGN_OR_RETURN(const cuda::CudaDriver* d, cuda::CudaDriver::Get());
  return cuda::CuCheck(*d, d->cuStreamSynchronize(nullptr), "gradd-bench");
}

absl::StatusOr<GpuReference> MeasureGpuReference(uint64_t size, int ranks,
                                                 int iterations) {
  ASSIGN_OR_RETURN(const cuda::CudaDriver* d, cuda::CudaDriver::Get());
  RETURN_IF_ERROR(cuda::UseDevice(*d, 0, "gradd-bench reference"));
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceAllocatorInterface> alloc,
                   cuda::CuMemAllocator::Create());
  std::vector<std::unique_ptr<DeviceMemoryInterface>> mem;
  std::vector<void*> buffers;
  for (int r = 0; r < std::max(ranks, 2); ++r) {
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceMemoryInterface> m,
                     alloc->Allocate(0, size));
    buffers.push_back(reinterpret_cast<void*>(m->address()));
    mem.push_back(std::move(m));
  }
  auto timed = [&](auto&& launch) -> absl::StatusOr<double> {
    std::vector<double> us;
    const int total = iterations + std::max(3, iterations / 10);
    for (int i = 0; i < total; ++i) {
      const double t0 = NowUs();
      RETURN_IF_ERROR(launch());
      RETURN_IF_ERROR(cuda::CuCheck(*d, d->cuStreamSynchronize(nullptr),
                                    "gradd-bench reference"));
      if (i >= total - iterations) us.push_back(NowUs() - t0);
    }
    return P50(std::move(us));
  };
  GpuReference ref;
  ASSIGN_OR_RETURN(const double copy_us, timed([&] {
                     return cuda::DeviceCopy(buffers[1], buffers[0], size,
                                             nullptr, "reference copy");
                   }));
  ref.bound_us = ranks * copy_us;
  ASSIGN_OR_RETURN(ref.kernel_us, timed([&] {
                     return cuda::DeviceFusedAverage(
                         DType::kFloat32, buffers.data(), ranks,
                         size / sizeof(float), ranks, nullptr,
                         "reference fused average");
                   }));
  return ref;
}

#else

namespace {
absl::Status NoCuda() {
  return absl::FailedPreconditionError(
      "gradd-bench was built without CUDA (GRADD_WITH_CUDA)");
}
}  // namespace

absl::Status GpuInit() { return NoCuda(); }
absl::Status GpuFill(void*, size_t, float) { return NoCuda(); }
absl::StatusOr<std::vector<float>> GpuRead(const void*, size_t) {
  return NoCuda();
}
absl::Status GpuSync() { return NoCuda(); }
absl::StatusOr<GpuReference> MeasureGpuReference(uint64_t, int, int) {
  return NoCuda();
}

#endif

}  // namespace gradd::bench
