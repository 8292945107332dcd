// RankRestartDeadlines: the rank restart grace of one active job, as this
// node's JobManager keeps it (server/engine/README.md, "Glossary": rank
// restart): which local ranks are away (their process went without Detach
// and the Job waits for a new one), until when, and what the end of the
// grace does. One per ActiveJob.
//
//   here --Away(r, now): session closed without Detach, the Job waits--+
//    ^                                                                  |
//    |                                                                  v
//    +-- Clear(r): a matching Attach took the rank back,  <--  away until
//                  or the rank is gone (detach, job end)       now + grace
//
//   Expire(now), once an away rank's deadline is at or before `now`: the
//   job fails ABORTED naming the first such rank and the grace, and every
//   rank still away is gone (the manager tells the Job, rank by rank).
//
// A job whose every rank is away keeps waiting (its memory kept) until the
// grace runs out.
//
// Pure logic, owned by the manager's control thread; time is passed in.
// Ranks outside [0, local world size) are never away (their calls do
// nothing).
#ifndef GRADD_SERVER_ENGINE_MANAGER_RANK_RESTART_DEADLINES_H_
#define GRADD_SERVER_ENGINE_MANAGER_RANK_RESTART_DEADLINES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace gradd {

class RankRestartDeadlines {
 public:
  // No ranks, no grace (an ActiveJob before Activate sets it).
  RankRestartDeadlines() = default;
  // Job `job_id` of `local_world_size` ranks with the effective rank
  // restart grace `grace` (zero: none, a rank's end is final).
  RankRestartDeadlines(std::string job_id, int local_world_size,
                       absl::Duration grace);

  absl::Duration grace() const { return grace_; }
  // The grace as the settings name it (rank_restart_grace_ms).
  uint32_t grace_ms() const {
    return static_cast<uint32_t>(absl::ToInt64Milliseconds(grace_));
  }
  bool has_grace() const { return grace_ > absl::ZeroDuration(); }

  bool away(int rank) const;
  // When `rank`'s grace runs out; InfiniteFuture when it is not away.
  absl::Time deadline(int rank) const;
  // The ranks away now, in order.
  std::vector<int> AwayRanks() const;
  // The earliest deadline (InfiniteFuture when no rank is away): when the
  // control loop must call Expire next.
  absl::Time NextDeadline() const;

  // `rank` went away at `now` (the Job waits for it): its deadline is
  // now + grace, returned. Nothing (InfiniteFuture) without a grace.
  absl::Time Away(int rank, absl::Time now);
  // `rank` is back or gone for good: no deadline any more.
  void Clear(int rank);

  // The end of the grace.
  struct Expiry {
    // ABORTED, naming the first rank whose grace ran out and the grace:
    // what the job fails with.
    absl::Status status;
    // Every rank that was away (each is gone now), in order.
    std::vector<int> gone;
  };
  // Nothing while no away rank's deadline is at or before `now`; else the
  // job's end as above, every away rank cleared.
  std::optional<Expiry> Expire(absl::Time now);

 private:
  std::string job_id_;
  absl::Duration grace_ = absl::ZeroDuration();
  // By local rank; InfiniteFuture: not away.
  std::vector<absl::Time> deadlines_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_MANAGER_RANK_RESTART_DEADLINES_H_
