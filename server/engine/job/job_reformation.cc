// Job's side of node loss and arrival (job.h "Elastic multi-node jobs";
// common/control_block.h "Re-formation"). What to do at a break and with
// a result is the ReformationDriver's (reformation_driver.h); here are the
// entry points other threads call, which only post to its inbox, and what
// the driver asks of the job's memory and phase (its JobSide): the control
// block's words, the one abort and the new group's words.
#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/doorbell.h"
#include "server/engine/job/job.h"

namespace gradd {

void Job::SetReformationHandler(ReformationHandler handler) {
  reformation_.SetHandler(std::move(handler));
}

void Job::RequestReformation(std::string reason) {
  if (reformation_.enabled()) {
    reformation_.inbox().PostRequest(std::move(reason));
  }
}

void Job::Reformed(absl::StatusOr<ReformationResult> result) {
  reformation_.inbox().PostResult(std::move(result));
}

uint64_t Job::epoch() const {
  return header_->epoch.load(std::memory_order_acquire);
}

ReducerStats Job::reducer_stats() const { return reducer_.stats(); }

int Job::live_world_size() const { return published_.world_size(); }

bool Job::NoteInterNodeError(const absl::Status& status,
                             absl::string_view what) {
  if (!reformation_.enabled()) return false;
  reformation_.inbox().PostError(std::string(what));
  return true;
}

void Job::FailJob(absl::string_view message) {
  FailOnEngine(absl::StatusCode::kAborted, message);
}

ReformationRequest Job::ReadControl() {
  std::atomic<uint64_t>* done = layout_.done_seq(control_.data());
  uint64_t completed =
      plan_.buckets.empty() ? 0 : std::numeric_limits<uint64_t>::max();
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    completed = std::min(completed, done[b].load(std::memory_order_acquire));
  }
  ReformationRequest r;
  r.completed_iteration = completed;
  r.sync_seq = header_->sync_seq.load(std::memory_order_acquire);
  r.epoch = epoch();
  return r;
}

Job::Abort Job::StartNewGroup(const ReformationResult& r) {
  // The job's hook, chosen before the break, carries over, but it is
  // settled again with the new group when the next bucket is about to
  // start (ResolveCommHook), as for a new job: a node admitted into the
  // job chooses its hook only then, and agreeing here would wait for it
  // in vain (its ranks first run the state sync).
  hook_resolved_ = false;
  // The one abort of the re-formation (control_block.h "Re-formation"),
  // then the new group's words, sync_seq last.
  const Abort abort = AbortInProgress(/*aborted_rank=*/-1);
  // The new reducer's sequence starts after the aborted iteration (its
  // network order counts iterations), from the plan the job formed with.
  reducer_->StartAt(abort.last + 1);
  if (!PlanSwitch::SameBuckets(plan_, spec_.plan)) {
    reducer_->Replan(abort.last + 1, static_cast<int>(plan_.buckets.size()));
  }
  header_->epoch.store(r.epoch, std::memory_order_relaxed);
  header_->world_size.store(static_cast<uint32_t>(r.world_size),
                            std::memory_order_relaxed);
  header_->state_behind.store(r.behind ? 1 : 0, std::memory_order_relaxed);
  header_->sync_seq.store(r.sync_seq, std::memory_order_release);
  WakeClients(layout_, control_.data());
  return abort;
}

}  // namespace gradd
