#include "client/src/plan/plan_views.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gradd {

absl::StatusOr<PlanViews> MapPlanViews(
    const google::protobuf::RepeatedPtrField<v1::BucketSpec>& specs,
    const std::vector<std::string>& names, const std::vector<int32_t>& dtypes,
    const std::vector<size_t>& bytes, char* base, uint64_t region_bytes,
    char* device_base, uint64_t device_bytes) {
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(parts...));
  };
  auto fits_in = [](uint64_t region, uint64_t offset, uint64_t size) {
    return offset <= region && size <= region - offset;
  };
  const size_t n = names.size();
  PlanViews out;
  out.buckets.resize(specs.size());
  out.data.assign(n, nullptr);
  out.bucket_of.assign(n, -1);
  for (int b = 0; b < specs.size(); ++b) {
    const v1::BucketSpec& spec = specs[b];
    const bool cuda = spec.device() == v1::DEVICE_CUDA;
    if (!fits_in(cuda ? device_bytes : region_bytes, spec.offset(),
                 spec.size_bytes())) {
      return bad("bucket ", b, " outside the rank's ",
                 cuda ? "device memory" : "memory");
    }
    char* const bucket_base = cuda ? device_base : base;
    if (spec.param_indices_size() == 0 ||
        spec.param_indices_size() != spec.param_offsets_size()) {
      return bad("bucket ", b, " has a malformed parameter list");
    }
    BucketInfo& info = out.buckets[b];
    info.dtype = static_cast<int32_t>(spec.dtype());
    info.size_bytes = spec.size_bytes();
    info.device = cuda ? 1 : 0;
    for (int k = 0; k < spec.param_indices_size(); ++k) {
      const int32_t i = spec.param_indices(k);
      if (i < 0 || static_cast<size_t>(i) >= n) {
        return bad("bucket ", b, " names parameter ", i);
      }
      if (out.bucket_of[i] >= 0) {
        return bad("parameter ", names[i], " is in buckets ", out.bucket_of[i],
                   " and ", b);
      }
      if (dtypes[i] != info.dtype) {
        return bad("parameter ", names[i], " in a bucket of another dtype");
      }
      const uint64_t off = spec.param_offsets(k);
      if (off > spec.size_bytes() || bytes[i] > spec.size_bytes() - off) {
        return bad("parameter ", names[i], " lies outside bucket ", b);
      }
      out.bucket_of[i] = b;
      out.data[i] = bucket_base + spec.offset() + off;
      info.params.push_back(i);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (out.bucket_of[i] < 0) {
      return bad("parameter ", names[i], " is in no bucket");
    }
  }
  return out;
}

}  // namespace gradd
