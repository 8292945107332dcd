#include "server/engine/job/plan_switch_requests.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace gradd {

void PlanSwitchRequests::ExpectRebuild(uint64_t iteration) {
  rebuild_after_.store(iteration, std::memory_order_release);
  Wake();  // the engine checks nobody ran ahead
}

void PlanSwitchRequests::Post(uint64_t iteration, BucketPlan plan, Done done,
                              std::optional<size_t> partition_bytes) {
  bool busy = false;
  {
    absl::MutexLock lock(&mu_);
    busy = request_.has_value();
    if (!busy) {
      request_ =
          Request{iteration, std::move(plan), std::move(done), partition_bytes};
      set_pending(true);
    }
  }
  if (busy) {
    std::move(done)(absl::FailedPreconditionError(
        absl::StrCat("job '", job_id_, "' is already switching bucket plans")));
    return;
  }
  Wake();
}

std::optional<uint64_t> PlanSwitchRequests::iteration() {
  absl::MutexLock lock(&mu_);
  if (!request_.has_value()) return std::nullopt;
  return request_->iteration;
}

std::optional<PlanSwitchRequests::Request> PlanSwitchRequests::Take() {
  return TakeSlot(&mu_, &request_);
}

void PlanSwitchRequests::Abort(const absl::Status& status) {
  std::optional<Request> taken = Take();
  if (!taken.has_value()) return;
  std::move(taken->done)(
      status.ok() ? absl::CancelledError(absl::StrCat(
                        "job '", job_id_, "' stopped during a bucket rebuild"))
                  : status);
}

}  // namespace gradd
