#include "server/backends/collective_backend.h"

#include "absl/strings/str_cat.h"
#include "common/reduce.h"

namespace gradd {

absl::Status CheckAccumulatorDType(absl::string_view op, DType dtype) {
  if (dtype == DType::kFloat32 || dtype == DType::kFloat64) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": dtype ", static_cast<int>(dtype),
                   " is not an accumulator type (float32/float64)"));
}

absl::Status CheckWireDType(absl::string_view op, DType dtype) {
  if (dtype == DType::kFloat16 || dtype == DType::kBFloat16) {
    return absl::OkStatus();
  }
  return CheckAccumulatorDType(op, dtype);
}

absl::Status CheckLocalAverage(const LocalAverage& work) {
  if (absl::Status s = CheckAccumulatorDType("AllreduceAverage", work.dtype);
      !s.ok()) {
    return s;
  }
  if (work.buffers.empty() || work.to_sum < 1 ||
      work.to_sum > static_cast<int>(work.buffers.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllreduceAverage: ", work.to_sum, " buffers to sum of ",
        work.buffers.size(), " (need 1 to the number of local buffers)"));
  }
  if (!(work.divisor > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllreduceAverage: divisor ", work.divisor, " is not > 0"));
  }
  return absl::OkStatus();
}

absl::Status CollectiveBackendInterface::AllreduceAverage(
    const LocalAverage& work) {
  if (absl::Status s = CheckLocalAverage(work); !s.ok()) return s;
  return AverageThroughAllreduceSum(work);
}

absl::Status CollectiveBackendInterface::AverageThroughAllreduceSum(
    const LocalAverage& work) {
  const int n = static_cast<int>(work.buffers.size());
  if (work.to_sum > 1) {
    SumToAccumulator(work.dtype, work.buffers.data(), work.to_sum,
                     work.buffers[0], 0, work.count);
  }
  if (absl::Status s = AllreduceSum(work.buffers[0], work.count, work.dtype);
      !s.ok()) {
    return s;
  }
  ScatterFromAccumulator(work.dtype, work.buffers[0], work.divisor,
                         work.buffers.data(), n, 0, work.count);
  return absl::OkStatus();
}

}  // namespace gradd
