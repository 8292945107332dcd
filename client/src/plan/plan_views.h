// The client's side of a bucket plan: where each parameter's gradient lives
// in this rank's bucket memory, checked against what the rank registered so
// that nothing the daemon sends can make us write outside the mapping. Used
// for the plan at attach and for a rebuilt plan (client/src/plan/rebuild.h).
#ifndef GRADD_CLIENT_SRC_PLAN_PLAN_VIEWS_H_
#define GRADD_CLIENT_SRC_PLAN_PLAN_VIEWS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "gradd/client.h"
#include "gradd/v1/node.pb.h"

namespace gradd {

struct PlanViews {
  std::vector<BucketInfo> buckets;
  // By parameter: its gradient's address and its bucket.
  std::vector<char*> data;
  std::vector<int> bucket_of;
};

// `dtypes[i]` / `bytes[i]`: parameter i as registered; `names[i]` for
// messages. Buckets must lie in [base, base + region_bytes) (CUDA buckets
// in [device_base, device_base + device_bytes), this process's mapping of
// the rank's device memory), every parameter in exactly one bucket of its
// dtype and inside it.
// INVALID_ARGUMENT saying what is wrong otherwise (the caller turns it into
// its own error).
absl::StatusOr<PlanViews> MapPlanViews(
    const google::protobuf::RepeatedPtrField<v1::BucketSpec>& specs,
    const std::vector<std::string>& names, const std::vector<int32_t>& dtypes,
    const std::vector<size_t>& bytes, char* base, uint64_t region_bytes,
    char* device_base = nullptr, uint64_t device_bytes = 0);

}  // namespace gradd

#endif  // GRADD_CLIENT_SRC_PLAN_PLAN_VIEWS_H_
