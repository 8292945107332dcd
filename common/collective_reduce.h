// Element types, reductions and kernels of the daemon's collectives of
// arbitrary data (allreduce / reduce_scatter, common/control_block.h), apart
// from the gradient kernels (reduce.h), which only know the float types.
//
// Values match the client's (gradd::dtype::k*, gradd::ReduceOp in
// client/include/gradd/) and the C ABI's: 1..4 are gradd.v1.DType's float
// types, 5..8 the integers only collectives carry.
//
// Accumulation: float16 / bfloat16 through a float32 accumulator (local sum,
// network sum, then one rounding back, as the bucket path does); every other
// type in itself. Integer sums wrap around as C++ unsigned arithmetic does
// (torch's integer sums overflow the same way); kAvg of integers is refused,
// as torch's Gloo backend refuses it.
#ifndef GRADD_COMMON_COLLECTIVE_REDUCE_H_
#define GRADD_COMMON_COLLECTIVE_REDUCE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradd {

enum class CollectiveDType : int32_t {
  kFloat32 = 1,
  kFloat64 = 2,
  kFloat16 = 3,
  kBFloat16 = 4,
  kInt32 = 5,
  kInt64 = 6,
  kUInt8 = 7,
  kInt8 = 8,
};

enum class CollectiveOp : int32_t { kSum = 0, kAvg = 1, kMin = 2, kMax = 3 };

// Validate raw values (as written into a shared slot); INVALID_ARGUMENT
// naming the value.
absl::StatusOr<CollectiveDType> CollectiveDTypeFromInt(int32_t value);
absl::StatusOr<CollectiveOp> CollectiveOpFromInt(int32_t value);
size_t CollectiveDTypeSize(CollectiveDType dtype);
// "float32", ..., "int8"; "sum", "avg", "min", "max".
const char* CollectiveDTypeName(CollectiveDType dtype);
const char* CollectiveOpName(CollectiveOp op);
bool IsIntegerDType(CollectiveDType dtype);
// INVALID_ARGUMENT for kAvg of an integer type.
absl::Status CheckReduction(CollectiveDType dtype, CollectiveOp op);
// float32 for float16 / bfloat16, the type itself otherwise.
CollectiveDType ReductionAccumulator(CollectiveDType dtype);

// acc[i] = srcs[0][i] op ... op srcs[n - 1][i] for i in [begin, end), in
// ReductionAccumulator(dtype) (kAvg: the sum). n >= 1; `acc` (the start of
// the accumulator, indexed like the sources) may be srcs[0] when the
// accumulator type is `dtype`.
void ReduceToAccumulator(CollectiveDType dtype, CollectiveOp op,
                         const void* const* srcs, int n, void* acc,
                         size_t begin, size_t end);

// out[i] = a[i] op b[i] for n accumulator elements (kAvg: sum); out may
// alias a or b. What an inter-node allreduce combines two nodes with.
using CombineFn = void (*)(void* out, const void* a, const void* b, size_t n);
CombineFn CombineFunction(CollectiveDType accumulator, CollectiveOp op);

// dsts[k][i] = acc[i] (kAvg: / divisor), rounded to `dtype`, for i in
// [begin, end) and every k; a dst may be `acc` itself.
void WriteFromAccumulator(CollectiveDType dtype, CollectiveOp op,
                          const void* acc, double divisor, void* const* dsts,
                          int n, size_t begin, size_t end);

}  // namespace gradd

#endif  // GRADD_COMMON_COLLECTIVE_REDUCE_H_
