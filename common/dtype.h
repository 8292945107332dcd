// Element types gradd reduces, their sizes and names. Mirrors
// gradd.v1.DType (proto/gradd/v1/node.proto) numerically.
#ifndef GRADD_COMMON_DTYPE_H_
#define GRADD_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace gradd {

enum class DType : int32_t {
  kFloat32 = 1,
  kFloat64 = 2,
  kFloat16 = 3,
  kBFloat16 = 4,
};

// Bytes per element.
size_t DTypeSize(DType dtype);
// "float32", "float64", "float16", "bfloat16".
std::string_view DTypeName(DType dtype);
// Validates a raw wire value (e.g. a proto enum); INVALID_ARGUMENT names it.
absl::StatusOr<DType> DTypeFromInt(int value);
// Parses "float32"/"float"/"fp32", "float64"/"double", "float16"/"half",
// "bfloat16"/"bf16".
absl::StatusOr<DType> DTypeFromName(std::string_view name);
// The type the daemon accumulates / sends between nodes: float32 for the
// 16-bit types, the type itself otherwise.
DType AccumulatorDType(DType dtype);

}  // namespace gradd

#endif  // GRADD_COMMON_DTYPE_H_
