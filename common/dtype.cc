#include "common/dtype.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace gradd {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
  }
  // Only reachable through a cast of an unvalidated integer; callers validate
  // with DTypeFromInt first. 0 makes any size computation visibly wrong.
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "invalid";
}

absl::StatusOr<DType> DTypeFromInt(int value) {
  switch (value) {
    case static_cast<int>(DType::kFloat32):
    case static_cast<int>(DType::kFloat64):
    case static_cast<int>(DType::kFloat16):
    case static_cast<int>(DType::kBFloat16):
      return static_cast<DType>(value);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported dtype ", value,
                       " (supported: float32, float64, float16, bfloat16)"));
  }
}

absl::StatusOr<DType> DTypeFromName(std::string_view name) {
  std::string lower = absl::AsciiStrToLower(std::string(name));
  if (lower == "float32" || lower == "float" || lower == "fp32") {
    return DType::kFloat32;
  }
  if (lower == "float64" || lower == "double" || lower == "fp64") {
    return DType::kFloat64;
  }
  if (lower == "float16" || lower == "half" || lower == "fp16") {
    return DType::kFloat16;
  }
  if (lower == "bfloat16" || lower == "bf16") return DType::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype \"", std::string(name),
                   "\" (supported: float32, float64, float16, bfloat16)"));
}

DType AccumulatorDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return DType::kFloat32;
    default:
      return dtype;
  }
}

}  // namespace gradd
