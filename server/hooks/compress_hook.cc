#include "server/hooks/compress_hook.h"

#include "common/reduce.h"
#include "server/engine/bucket_reducer.h"

namespace gradd {

absl::Status Compress16Hook::Run(const CommHookWork& work,
                                 CollectiveBackendInterface& net) {
  const std::vector<void*>& buffers = *work.rank_buffers;
  const int n = static_cast<int>(buffers.size());
  const size_t count = work.count;
  if (count == 0 || n == 0) return absl::OkStatus();
  wire_buf_.resize(count);
  void* wire = wire_buf_.data();
  const double world = world_size_;

  if (work.dtype == DType::kFloat64) {
    // Rare (float64 models): plain loops through double.
    acc64_.assign(count, 0.0);
    for (int r = 0; r < n; ++r) {
      const double* in = static_cast<const double*>(buffers[r]);
      for (size_t i = 0; i < count; ++i) acc64_[i] += in[i];
    }
    for (size_t i = 0; i < count; ++i) {
      const float v = static_cast<float>(acc64_[i] / world);
      wire_buf_[i] =
          wire_ == DType::kFloat16 ? FloatToHalf(v) : FloatToBFloat16(v);
    }
    if (absl::Status s = net.AllreduceSum(wire, count, wire_); !s.ok()) {
      return s;
    }
    for (size_t i = 0; i < count; ++i) {
      const double v = wire_ == DType::kFloat16 ? HalfToFloat(wire_buf_[i])
                                                : BFloat16ToFloat(wire_buf_[i]);
      for (int r = 0; r < n; ++r) static_cast<double*>(buffers[r])[i] = v;
    }
    return absl::OkStatus();
  }

  // float32 buckets sum in place into local rank 0's bucket; 16-bit buckets
  // into a private float32 accumulator.
  void* acc = buffers[0];
  if (work.dtype != DType::kFloat32) {
    acc_.resize(count);
    acc = acc_.data();
  }
  void* const wire_out[1] = {wire};
  SplitAcrossPool(pool_, DType::kFloat32, 0, count, [&](size_t b, size_t e) {
    SumToAccumulator(work.dtype, buffers.data(), n, acc, b, e);
    // Divided in float32 and rounded once to 16 bits.
    ScatterFromAccumulator(wire_, acc, world, wire_out, 1, b, e);
  });
  if (absl::Status s = net.AllreduceSum(wire, count, wire_); !s.ok()) {
    return s;
  }
  const void* const wire_in[1] = {wire};
  SplitAcrossPool(pool_, DType::kFloat32, 0, count, [&](size_t b, size_t e) {
    SumToAccumulator(wire_, wire_in, 1, acc, b, e);  // 16 bits -> float32
    ScatterFromAccumulator(work.dtype, acc, 1.0, buffers.data(), n, b, e);
  });
  return absl::OkStatus();
}

}  // namespace gradd
