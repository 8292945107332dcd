#include "server/engine/job/plan_switch.h"

namespace gradd {

bool PlanSwitch::Begin(uint64_t k) {
  if (switching_) return false;
  switching_ = true;
  iteration_ = k;
  return true;
}

void PlanSwitch::End() {
  switching_ = false;
  iteration_ = 0;
}

PlanSwitch::Check PlanSwitch::AtBoundary(
    size_t num_buckets, absl::FunctionRef<uint64_t(size_t)> started,
    absl::FunctionRef<uint64_t(size_t)> done) const {
  Check c;
  // The boundary: every bucket of iteration k back from the reducer, none
  // of k + 1 started.
  for (size_t b = 0; b < num_buckets; ++b) {
    const uint64_t d = done(b);
    if (started(b) > d || d < iteration_) return c;  // k still in flight
    if (d > iteration_) {
      c.boundary = Boundary::kPassed;
      c.bucket = b;
      c.done = d;
      return c;
    }
  }
  c.boundary = Boundary::kReached;
  return c;
}

bool PlanSwitch::Fits(const BucketPlan& plan, const Capacity& capacity) {
  return plan.buckets.size() <= capacity.bucket_slots &&
         plan.total_bytes <= capacity.region_bytes &&
         plan.device_bytes <= capacity.device_region_bytes;
}

bool PlanSwitch::SameBuckets(const BucketPlan& a, const BucketPlan& b) {
  if (a.buckets.size() != b.buckets.size()) return false;
  for (size_t i = 0; i < a.buckets.size(); ++i) {
    if (a.buckets[i].params != b.buckets[i].params) return false;
  }
  return true;
}

}  // namespace gradd
