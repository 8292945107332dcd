// The raw launchers of the device reducers (device_reduce_kernels.cu),
// kept free of absl so nvcc compiles only CUDA and the standard library.
// Use common/cuda/device_reduce.h, which checks arguments and turns the
// cudaError_t into an absl::Status. `dtype` is gradd::DType's value.
#ifndef GRADD_COMMON_CUDA_DEVICE_REDUCE_KERNELS_H_
#define GRADD_COMMON_CUDA_DEVICE_REDUCE_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace gradd::cuda::kernels {

// Buffers one launch takes (trainers sharing one GPU).
inline constexpr int kMaxBuffers = 16;

// Return cudaError_t values (0 = launched).
int LaunchFusedAverage(int dtype, void* const* buffers, int n, size_t count,
                       double divisor, void* stream);
int LaunchSumToAccumulator(int dtype, const void* const* srcs, int n, void* acc,
                           size_t count, void* stream);
int LaunchScatterFromAccumulator(int dtype, const void* acc, double divisor,
                                 void* const* outs, int n, size_t count,
                                 void* stream);
int LaunchCopy(void* dst, const void* src, size_t bytes, void* stream);
// cudaGetErrorName / cudaGetErrorString of a launcher's result.
const char* ErrorName(int error);
const char* ErrorString(int error);

}  // namespace gradd::cuda::kernels

#endif  // GRADD_COMMON_CUDA_DEVICE_REDUCE_KERNELS_H_
