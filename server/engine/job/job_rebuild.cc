// Job's side of a bucket rebuild: switching the engine to a new plan at an
// iteration boundary (the state machine is drawn in job.h). Which plan, and
// when every rank and node agrees on it, is engine/job/rebuild.h's business.
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/doorbell.h"
#include "server/engine/job/job.h"

namespace gradd {

void Job::MapBuckets() {
  const int world = spec_.local_world_size;
  bucket_buffers_.assign(plan_.buckets.size(), {});
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const Bucket& bucket = plan_.buckets[b];
    for (int r = 0; r < world; ++r) {
      char* base = bucket.device == DeviceKind::kCuda
                       ? reinterpret_cast<char*>(device_memory_[r]->address())
                       : static_cast<char*>(rank_maps_[r].data());
      bucket_buffers_[b].push_back(base + bucket.offset);
    }
  }
  PublishPlan();
  traces_.Reset(plan_);
}

void Job::ExpectRebuild(uint64_t iteration) {
  switch_requests_.ExpectRebuild(iteration);
}

void Job::SwitchPlan(uint64_t iteration, BucketPlan plan, SwitchDone done,
                     std::optional<size_t> partition_bytes) {
  switch_requests_.Post(iteration, std::move(plan), std::move(done),
                        partition_bytes);
}

void Job::AbortSwitch(const absl::Status& status) {
  switch_requests_.Abort(status);
  plan_switch_.End();
}

bool Job::TrySwitchPlan() {
  void* base = control_.data();
  std::atomic<uint64_t>* done = layout_.done_seq(base);
  const int world = spec_.local_world_size;
  const std::optional<uint64_t> requested = switch_requests_.iteration();
  if (!requested.has_value()) return false;
  const uint64_t k = *requested;
  if (plan_switch_.Begin(k)) {
    EnterPhase(Phase::kSwitchingPlan,
               absl::StrCat("bucket rebuild after iteration ", k));
  }
  // The boundary: every bucket of iteration k back from the reducer, none
  // of k + 1 published (ranks that run ahead are failed by Scan).
  const PlanSwitch::Check at = plan_switch_.AtBoundary(
      plan_.buckets.size(), [&](size_t b) { return started_[b]; },
      [&](size_t b) { return done[b].load(std::memory_order_acquire); });
  if (at.boundary == PlanSwitch::Boundary::kNotYet) return false;
  if (at.boundary == PlanSwitch::Boundary::kPassed) {
    const std::string message = absl::StrCat(
        "job '", spec_.job_id, "': bucket rebuild after iteration ", k,
        " requested, but bucket ", at.bucket, " already completed iteration ",
        at.done);
    FailOnEngine(absl::StatusCode::kFailedPrecondition, message);
    AbortSwitch(absl::FailedPreconditionError(message));
    return false;
  }
  PlanSwitchRequests::Request next = *switch_requests_.Take();
  plan_switch_.End();
  // CUDA buckets: the new plan lies in the same device memory, allocated
  // for any plan (MaxPlanBytes), so the ranks' mappings stay valid.
  if (!PlanSwitch::Fits(next.plan, {layout_.num_buckets(), bucket_region_bytes_,
                                    device_region_bytes_})) {
    const std::string message =
        absl::StrCat("job '", spec_.job_id, "': the rebuilt plan (",
                     next.plan.buckets.size(), " buckets, ",
                     next.plan.total_bytes, " bytes, ", next.plan.device_bytes,
                     " bytes of device memory) does not fit the job's ",
                     layout_.num_buckets(), " bucket slots, ",
                     bucket_region_bytes_, "-byte bucket region and ",
                     device_region_bytes_, "-byte device region");
    FailOnEngine(absl::StatusCode::kInternal, message);
    std::move(next.done)(absl::InternalError(message));
    return false;
  }
  plan_ = std::move(next.plan);
  MarkInternalBuckets(spec_.params, &plan_);
  MapBuckets();
  started_.assign(plan_.buckets.size(), k);
  // Join's per-bucket scratch follows the plan (it is rebuilt per round).
  active_buffers_.assign(plan_.buckets.size(), {});
  active_ranks_.assign(plan_.buckets.size(), {});
  // Every bucket of the new plan starts at the boundary: done and ready
  // for k on every rank, so Scan's "done or done + 1" rule holds for them.
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    for (int r = 0; r < world; ++r) {
      layout_.ready_row(base, r)[b].store(k, std::memory_order_relaxed);
    }
    done[b].store(k, std::memory_order_release);
  }
  reducer_->Replan(k + 1, static_cast<int>(plan_.buckets.size()));
  if (next.partition_bytes.has_value()) {
    reducer_->SetPartitionBytes(k + 1, *next.partition_bytes);
  }
  if (hook_resolved_) {
    if (absl::Status s = InstallCommHook(); !s.ok()) {
      const std::string message = absl::StrCat(
          "job '", spec_.job_id,
          "': the communication hook cannot follow the rebuilt buckets: ",
          s.message());
      FailOnEngine(s.code(), message);
      std::move(next.done)(absl::Status(s.code(), message));
      return false;
    }
  }
  switch_requests_.ClearRebuild();
  EnterPhase(Phase::kRunning,
             absl::StrCat("switched to the rebuilt plan after iteration ", k));
  std::move(next.done)(absl::OkStatus());
  return true;
}

}  // namespace gradd
