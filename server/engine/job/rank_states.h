// The two hand-offs of a job's rank lifecycle (job.h) between the job
// manager's control thread and the engine thread:
//
// RankStates: each local rank's state (live, detached, disconnected,
// restarting) and when a restarting rank began restarting. The control
// thread moves a rank away (Gone) or into restarting (BeginRestart); the
// engine reads the states in every scan and moves a restarted rank back to
// live (EndRestart). Lock-free: one atomic per rank, so the engine's scan
// costs one load per rank.
//
// RankRestartInbox: restarting ranks that attached again, each with the
// answer to its Attach. Post from any thread; the engine takes them at a
// quiet point (job_restart.cc) or answers them all with an error
// (FailAll: the job failed). After Close (the job stopped) a post is
// answered at once with the close status; nothing is left unanswered.
#ifndef GRADD_SERVER_ENGINE_JOB_RANK_STATES_H_
#define GRADD_SERVER_ENGINE_JOB_RANK_STATES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gradd/v1/node.pb.h"
#include "server/engine/job/mailbox.h"

namespace gradd {

class RankStates {
 public:
  enum State : int {
    kLive = 0,
    kDetached = 1,
    kDisconnected = 2,
    kRestarting = 3
  };

  explicit RankStates(int world);
  RankStates(const RankStates&) = delete;
  RankStates& operator=(const RankStates&) = delete;

  int world() const { return world_; }
  // Any thread.
  State state(int rank) const {
    return static_cast<State>(states_[rank].load());
  }
  bool live(int rank) const { return state(rank) == kLive; }
  bool restarting(int rank) const { return state(rank) == kRestarting; }
  bool all_live() const {
    for (int r = 0; r < world_; ++r) {
      if (!live(r)) return false;
    }
    return true;
  }
  int live_count() const { return Count(kLive); }
  int restarting_count() const { return Count(kRestarting); }

  // Any thread: a live or restarting rank left (detached: a clean Detach;
  // else its session closed). Returns the state it left (a rank already
  // gone stays as it is and its state is returned).
  State Gone(int rank, bool detached);
  // Any thread: a live rank begins restarting at `now_ns`. False (nothing
  // changes) when it is not live.
  bool BeginRestart(int rank, int64_t now_ns);
  // Engine thread: a restarting rank is back. False when it went away
  // meanwhile (its grace ran out).
  bool EndRestart(int rank);
  // When `rank` began restarting (0: unknown), and forgets it.
  int64_t TakeRestartSince(int rank) {
    return since_ns_[rank].exchange(0, std::memory_order_relaxed);
  }

 private:
  int Count(State s) const {
    int n = 0;
    for (int r = 0; r < world_; ++r) n += state(r) == s;
    return n;
  }

  const int world_;
  std::unique_ptr<std::atomic<int>[]> states_;
  std::unique_ptr<std::atomic<int64_t>[]> since_ns_;
};

// What a re-attached rank is told: the Attach response (ResponseFor with
// restarted, next_iteration, collective_seq and sync_seq set), or why it
// cannot rejoin (Job::RankRestartDone).
using RankRestartDone =
    absl::AnyInvocable<void(absl::StatusOr<v1::AttachResponse>) &&>;

class RankRestartInbox final : public Mailbox {
 public:
  // `wake` rings the engine (called after each post, outside the lock).
  explicit RankRestartInbox(absl::AnyInvocable<void()> wake)
      : Mailbox(std::move(wake)) {}

  struct Request {
    int rank = 0;
    RankRestartDone done;
  };
  // Any thread: local rank `rank` attached again; `done` answers it.
  void Post(int rank, RankRestartDone done);
  // Engine thread (pending(): a request waits): every request waiting, in
  // the order posted.
  std::vector<Request> TakeAll();
  // Answers every request waiting with `status` (the job failed).
  void FailAll(const absl::Status& status);
  // The job stopped: FailAll(status), and later posts are answered with
  // `status` at once.
  void Close(const absl::Status& status);

 private:
  absl::Mutex mu_;
  std::optional<absl::Status> closed_ ABSL_GUARDED_BY(mu_);
  std::vector<Request> requests_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_RANK_STATES_H_
