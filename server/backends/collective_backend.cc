#include "server/backends/collective_backend.h"

#include <cstdint>
#include <string>
#include <vector>

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
  if (work.wire_dtype() != work.dtype &&
      !(work.dtype == DType::kFloat32 &&
        (work.wire == DType::kFloat16 || work.wire == DType::kBFloat16))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllreduceAverage: ", std::string(DTypeName(work.dtype)),
        " buckets cannot travel as ", std::string(DTypeName(*work.wire)),
        " (16-bit wires carry float32 buckets only)"));
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
  if (work.wire_dtype() != work.dtype) {
    // Divided and rounded to 16 bits, summed in 16 bits, converted back.
    std::vector<uint16_t> wire(work.count);
    void* const wire_out[1] = {wire.data()};
    ScatterFromAccumulator(*work.wire, work.buffers[0], work.divisor, wire_out,
                           1, 0, work.count);
    if (absl::Status s = AllreduceSum(wire.data(), work.count, *work.wire);
        !s.ok()) {
      return s;
    }
    const void* const wire_in[1] = {wire.data()};
    for (int k = 0; k < n; ++k) {
      SumToAccumulator(*work.wire, wire_in, 1, work.buffers[k], 0, work.count);
    }
    return absl::OkStatus();
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

namespace gradd {

absl::Status CollectiveBackendInterface::AllreduceWith(void*, size_t, size_t,
                                                       CombineFn) {
  return absl::UnimplementedError(
      "this collective backend has no allreduce of arbitrary data "
      "(collectives need the Gloo backend between daemons)");
}

}  // namespace gradd
