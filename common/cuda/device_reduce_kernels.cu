// The GPU twins of common/reduce.h's kernels, with the same numerics:
//   result = (x_0 + ... + x_{n-1}) / divisor
// summed left to right in the accumulator type (float for float16,
// bfloat16 and float32; double for float64), divided (IEEE division, no
// reciprocal; gradd builds without --use_fast_math), rounded once to the
// element type with round-to-nearest-even. So a bucket averaged on the GPU
// holds the same bits as one averaged by the CPU reducer.
//
// Each thread moves 16 bytes per buffer per step (one uint4: 4 floats,
// 8 halves, 2 doubles) in a grid-stride loop; the tail that does not fill
// a vector is done element by element. Buckets are 256-byte aligned
// (common/bucket_planner.h); unaligned pointers take the scalar path.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/device_reduce_kernels.h"

namespace gradd::cuda::kernels {
namespace {

// gradd::DType values (common/dtype.h).
constexpr int kFloat32 = 1;
constexpr int kFloat64 = 2;
constexpr int kFloat16 = 3;
constexpr int kBFloat16 = 4;

struct Ptrs {
  void* p[kMaxBuffers];
};

template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};

template <typename T>
__device__ __forceinline__ typename Acc<T>::type Load(T v) {
  return v;
}
__device__ __forceinline__ float Load(__half v) { return __half2float(v); }
__device__ __forceinline__ float Load(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T Store(typename Acc<T>::type v) {
  return v;
}
template <>
__device__ __forceinline__ __half Store<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 Store<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

constexpr int kVectorBytes = 16;

template <typename T>
union Vec {
  uint4 raw;
  T e[kVectorBytes / sizeof(T)];
};

// Mode: 0 = fused average in place, 1 = sum to accumulator, 2 = scatter
// from accumulator.
template <typename T, int kMode>
__global__ void ReduceKernel(Ptrs bufs, int n, const void* acc_in,
                             void* acc_out, size_t count, bool vector,
                             typename Acc<T>::type divisor) {
  using A = typename Acc<T>::type;
  constexpr int kPer = kVectorBytes / sizeof(T);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t vectors = vector ? count / kPer : 0;
  for (size_t v = tid; v < vectors; v += stride) {
    A sum[kPer];
    if (kMode == 2) {
      Vec<A> a[sizeof(A) * kPer / kVectorBytes];
      for (int j = 0; j < static_cast<int>(sizeof(A) * kPer / kVectorBytes);
           ++j) {
        a[j].raw = reinterpret_cast<const uint4*>(
            acc_in)[v * (sizeof(A) * kPer / kVectorBytes) + j];
      }
      for (int e = 0; e < kPer; ++e) {
        sum[e] =
            a[e / (kVectorBytes / sizeof(A))].e[e % (kVectorBytes / sizeof(A))];
      }
    } else {
      Vec<T> x;
      x.raw = reinterpret_cast<const uint4*>(bufs.p[0])[v];
      for (int e = 0; e < kPer; ++e) sum[e] = Load(x.e[e]);
      for (int k = 1; k < n; ++k) {
        x.raw = reinterpret_cast<const uint4*>(bufs.p[k])[v];
        for (int e = 0; e < kPer; ++e) sum[e] += Load(x.e[e]);
      }
    }
    if (kMode == 1) {
      A* out = reinterpret_cast<A*>(acc_out) + v * kPer;
      for (int e = 0; e < kPer; ++e) out[e] = sum[e];
    } else {
      Vec<T> y;
      for (int e = 0; e < kPer; ++e) y.e[e] = Store<T>(sum[e] / divisor);
      for (int k = 0; k < n; ++k)
        reinterpret_cast<uint4*>(bufs.p[k])[v] = y.raw;
    }
  }
  for (size_t i = vectors * kPer + tid; i < count; i += stride) {
    A sum;
    if (kMode == 2) {
      sum = reinterpret_cast<const A*>(acc_in)[i];
    } else {
      sum = Load(reinterpret_cast<const T*>(bufs.p[0])[i]);
      for (int k = 1; k < n; ++k)
        sum += Load(reinterpret_cast<const T*>(bufs.p[k])[i]);
    }
    if (kMode == 1) {
      reinterpret_cast<A*>(acc_out)[i] = sum;
    } else {
      const T y = Store<T>(sum / divisor);
      for (int k = 0; k < n; ++k) reinterpret_cast<T*>(bufs.p[k])[i] = y;
    }
  }
}

bool Aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kVectorBytes == 0;
}

template <typename T, int kMode>
int Launch(void* const* bufs, int n, const void* acc_in, void* acc_out,
           size_t count, double divisor, void* stream) {
  if (count == 0) return cudaSuccess;
  Ptrs ptrs = {};
  bool vector = Aligned(acc_in) && Aligned(acc_out);
  for (int k = 0; k < n; ++k) {
    ptrs.p[k] = bufs[k];
    vector = vector && Aligned(bufs[k]);
  }
  constexpr int kThreads = 512;
  constexpr size_t kPer = kVectorBytes / sizeof(T);
  const size_t work = vector ? (count + kPer - 1) / kPer : count;
  // Enough blocks to fill an H200 (132 SMs x 4 resident 512-thread blocks)
  // without launching more than the work needs.
  size_t blocks = (work + kThreads - 1) / kThreads;
  if (blocks > 132 * 4) blocks = 132 * 4;
  using A = typename Acc<T>::type;
  ReduceKernel<T, kMode><<<static_cast<unsigned>(blocks), kThreads, 0,
                           static_cast<cudaStream_t>(stream)>>>(
      ptrs, n, acc_in, acc_out, count, vector, static_cast<A>(divisor));
  return cudaGetLastError();
}

template <int kMode>
int Dispatch(int dtype, void* const* bufs, int n, const void* acc_in,
             void* acc_out, size_t count, double divisor, void* stream) {
  switch (dtype) {
    case kFloat32:
      return Launch<float, kMode>(bufs, n, acc_in, acc_out, count, divisor,
                                  stream);
    case kFloat64:
      return Launch<double, kMode>(bufs, n, acc_in, acc_out, count, divisor,
                                   stream);
    case kFloat16:
      return Launch<__half, kMode>(bufs, n, acc_in, acc_out, count, divisor,
                                   stream);
    case kBFloat16:
      return Launch<__nv_bfloat16, kMode>(bufs, n, acc_in, acc_out, count,
                                          divisor, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

int LaunchFusedAverage(int dtype, void* const* buffers, int n, size_t count,
                       double divisor, void* stream) {
  return Dispatch<0>(dtype, buffers, n, nullptr, nullptr, count, divisor,
                     stream);
}

int LaunchSumToAccumulator(int dtype, const void* const* srcs, int n, void* acc,
                           size_t count, void* stream) {
  return Dispatch<1>(dtype, const_cast<void* const*>(srcs), n, nullptr, acc,
                     count, 1.0, stream);
}

int LaunchScatterFromAccumulator(int dtype, const void* acc, double divisor,
                                 void* const* outs, int n, size_t count,
                                 void* stream) {
  return Dispatch<2>(dtype, outs, n, acc, nullptr, count, divisor, stream);
}

int LaunchCopy(void* dst, const void* src, size_t bytes, void* stream) {
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                         static_cast<cudaStream_t>(stream));
}

const char* ErrorName(int error) {
  return cudaGetErrorName(static_cast<cudaError_t>(error));
}
const char* ErrorString(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

}  // namespace gradd::cuda::kernels
