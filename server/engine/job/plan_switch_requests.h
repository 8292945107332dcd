// What other threads hand the engine about a plan switch (job.h "Plan
// switch"; job_rebuild.cc): that the ranks will rebuild after an iteration
// (ExpectRebuild: from then on a rank running past it fails the job), and
// the switch itself (the new plan and the answer to the rebuild). The
// engine's side of the switch is PlanSwitch (plan_switch.h).
//
// Threads: ExpectRebuild and Post from any thread (the rebuild
// coordinator's); they wake the engine. rebuild_after(), pending() and
// in_play() from any thread; iteration(), Take(), ClearRebuild() on the
// engine thread. One switch at a time: a second Post is answered
// FAILED_PRECONDITION at once. Abort answers the switch waiting (the job
// failed or stops); nothing is left unanswered.
#ifndef GRADD_SERVER_ENGINE_JOB_PLAN_SWITCH_REQUESTS_H_
#define GRADD_SERVER_ENGINE_JOB_PLAN_SWITCH_REQUESTS_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/bucket_planner.h"
#include "server/engine/job/mailbox.h"

namespace gradd {

class PlanSwitchRequests final : public Mailbox {
 public:
  using Done = absl::AnyInvocable<void(absl::Status) &&>;
  struct Request {
    uint64_t iteration = 0;  // the plan switches after it
    BucketPlan plan;
    Done done;
    // Autotune: the reducer's network partition from the switch on
    // (unset: unchanged).
    std::optional<size_t> partition_bytes;
  };

  // `job_id` names the job in errors; `wake` rings the engine (called
  // after each post, outside the lock).
  PlanSwitchRequests(std::string job_id, absl::AnyInvocable<void()> wake)
      : Mailbox(std::move(wake)), job_id_(std::move(job_id)) {}

  // Any thread: the ranks rebuild after `iteration`.
  void ExpectRebuild(uint64_t iteration);
  // Any thread: 0, or the iteration after which the ranks rebuild.
  uint64_t rebuild_after() const {
    return rebuild_after_.load(std::memory_order_acquire);
  }
  // Engine thread: the switch is done; no rebuild expected any more.
  void ClearRebuild() { rebuild_after_.store(0, std::memory_order_release); }

  // Any thread: switch to `plan` after `iteration`, then answer `done`.
  void Post(uint64_t iteration, BucketPlan plan, Done done,
            std::optional<size_t> partition_bytes = std::nullopt);
  // Any thread (pending(): a switch waits): a rebuild is expected or a switch
  // waits (a rank restart or a re-formation cannot run through one).
  bool in_play() const { return rebuild_after() != 0 || pending(); }

  // Engine thread: the waiting switch's iteration (none: nullopt).
  std::optional<uint64_t> iteration();
  // Engine thread: the waiting switch, to carry out (none: nullopt).
  std::optional<Request> Take();
  // Answers the waiting switch (if any) with `status`, or when `status` is
  // OK with CANCELLED (the job stopped during the rebuild).
  void Abort(const absl::Status& status);

 private:
  const std::string job_id_;
  std::atomic<uint64_t> rebuild_after_{0};
  absl::Mutex mu_;
  std::optional<Request> request_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_PLAN_SWITCH_REQUESTS_H_
