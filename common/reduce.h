// Reduction kernels of the daemon's data path. Vectorised (the compiler's
// auto-vectorisation on contiguous loops, with float32 accumulation for the
// 16-bit types and round-to-nearest-even back), single-threaded: callers split
// [begin, end) element ranges across threads (see ParallelFor).
//
// Numerics, relied upon by tests that check exact closed forms:
//   result = (x_0 + x_1 + ... + x_{n-1}) / divisor
// summed left to right in the accumulator type (float for float16/bfloat16
// and float32, double for float64), divided (not multiplied by a reciprocal),
// rounded once to the output type.
#ifndef GRADD_COMMON_REDUCE_H_
#define GRADD_COMMON_REDUCE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/dtype.h"

namespace gradd {

// Averages element-wise across n buffers and writes the result into all of
// them (single-node fused path). Elements [begin, end).
void FusedAverage(DType dtype, void* const* buffers, int n, size_t begin,
                  size_t end, double divisor);

// acc[i] = sum_k srcs[k][i] for i in [begin, end). `acc` has type
// AccumulatorDType(dtype) (multi-node: the node's partial sum). When that
// is dtype itself (float32, float64), acc may be srcs[0]: summed in place.
// No other overlap is allowed.
void SumToAccumulator(DType dtype, const void* const* srcs, int n, void* acc,
                      size_t begin, size_t end);

// outs[k][i] = acc[i] / divisor for every k, converting from
// AccumulatorDType(dtype) back to dtype (multi-node write-back). For
// float32/float64, acc may be outs[0] (written back in place); no other
// overlap is allowed.
void ScatterFromAccumulator(DType dtype, const void* acc, double divisor,
                            void* const* outs, int n, size_t begin, size_t end);

// The 16-bit wire of the compression hooks (wire float16 or bfloat16),
// float32 sources: out[i] = to16(float(to16(sum_k srcs[k][i] / divisor)) +
// float(add[i])) for i in [begin, end), or to16(sum_k srcs[k][i] /
// divisor) when `add` is null -- a node's compressed value, added to a
// partial sum that arrived, in one pass with the roundings of
// SumToAccumulator, ScatterFromAccumulator (to 16 bits), SumToAccumulator
// of the two 16-bit values and ScatterFromAccumulator again. `out` may not
// overlap the sources; it may be `add`.
void CompressAdd16(DType wire, const float* const* srcs, int n, double divisor,
                   const uint16_t* add, uint16_t* out, size_t begin,
                   size_t end);

// The kernel set in use: "avx2+f16c" (chosen at run time when the CPU has
// it) or "baseline" (plain x86-64 / other CPUs). For logs and benchmarks.
std::string_view ReduceKernelIsa();
// Tests only: run the baseline kernels even on an AVX2 machine (false goes
// back to the best set). Not thread-safe against concurrent reductions.
void ForceBaselineReduceKernelsForTesting(bool baseline);

// 16-bit conversions (round to nearest even; NaN stays NaN).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t h);
uint16_t FloatToBFloat16(float f);

}  // namespace gradd

#endif  // GRADD_COMMON_REDUCE_H_
