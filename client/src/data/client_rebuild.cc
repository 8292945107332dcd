// ClientImpl::RebuildBuckets (client_impl.h): the client's side of a bucket
// rebuild (plan/rebuild.h draws it): the RebuildBuckets RPC with the
// recorded ready order, then every gradient moved to its place in the new
// plan (plan/plan_move.h) and the views switched over. Between iterations
// only, on the caller thread.
#include <cstddef>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/src/data/client_impl.h"
#include "client/src/plan/plan_move.h"
#include "client/src/plan/plan_views.h"
#include "client/src/plan/rebuild.h"
#include "common/status_macros.h"

namespace gradd::internal {

absl::StatusOr<bool> ClientImpl::RebuildBuckets() {
  RETURN_IF_ERROR(CheckFailed());
  // A daemon that reserved no bucket region (older than rebuilds) cannot
  // rebuild: every rank of the node sees the same, so nobody asks.
  const uint64_t it = iteration_.load(std::memory_order_relaxed);
  // Autotune's switches come after the rebuild, at the iterations the
  // daemon named (the order sent is not used then).
  const bool switch_due =
      rebuilt_ && next_switch_ != 0 && it == next_switch_ + 1;
  if ((rebuilt_ && !switch_due) || !options_.rebuild_buckets ||
      !daemon_can_rebuild_ || recorder_->last().empty()) {
    return false;
  }
  for (int i = 0; i < num_params(); ++i) {
    if (marked_[i].load(std::memory_order_acquire) == it) {
      return absl::FailedPreconditionError(absl::StrCat(
          "RebuildBuckets called inside iteration ", it, " (parameter '",
          params_[i].name, "' already marked ready; ", Who(),
          "): call it between WaitAll and the next MarkReady"));
    }
  }
  RebuildCall call;
  call.job_id = options_.job_id;
  call.local_rank = options_.local_rank;
  call.session_id = session_id_;
  call.next_iteration = it;
  call.ready_order = recorder_->last();
  call.timeout = options_.attach_timeout;  // the call waits for every rank
  call.who = Who();
  call.names = &names_;
  call.dtypes = &dtypes_;
  call.bytes = &bytes_;
  call.base = static_cast<char*>(memory_.data());
  call.region_bytes = bucket_region_bytes_;
  if (device_ != nullptr) {
    call.device_base = device_->base();
    call.device_bytes = device_->size();
  }
  uint64_t next_switch = 0;
  call.next_switch_after = &next_switch;
  // Any failure is the job's too (the daemon failed it, or it sent what we
  // cannot use): this client is done.
  absl::StatusOr<PlanViews> views = RequestRebuild(*stub_, call);
  if (!views.ok()) return Fail(views.status());
  GradientPlaces now;
  for (const ParamSlot& p : params_) {
    now.data.push_back(p.data);
    now.on_device.push_back(buckets_[p.bucket].device != 0);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].device != 0) now.device_buckets.push_back(b);
  }
  // Every gradient keeps its contents (the last average, which the trainer
  // may go on accumulating into), as DDP copies grads into its new bucket
  // views; CUDA ones through the device (a host sync, once per job).
  if (absl::Status s = MoveToPlan(now, *views, bytes_, device_.get(), Who());
      !s.ok()) {
    return Fail(std::move(s));
  }
  UsePlan(*std::move(views));
  rebuilt_ = true;
  next_switch_ = next_switch;
  recorder_->Stop();
  return true;
}

}  // namespace gradd::internal
