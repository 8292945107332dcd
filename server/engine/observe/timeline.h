// Timeline: one job's most recent bucket events, in a bounded ring that
// `graddctl trace` turns into a Chrome/Perfetto trace (tools/graddctl/trace.h,
// from the admin API's GetTrace).
//
// Per reduced bucket it keeps each local rank's "ready" span (from when the
// engine saw the rank hand the bucket over to when the bucket started: how
// long that rank waited for the others) and the node's "local_reduce",
// "network" and "write_back" spans and its "done" instant, and the rank
// restart events (OnRankRestarting / OnRankRestarted). The ring is
// allocated once (capacity entries); the oldest entries are overwritten.
//
// Threads: OnBucket from the job's completion thread (one short lock, no
// allocation); Snapshot from any thread.
#ifndef GRADD_SERVER_ENGINE_OBSERVE_TIMELINE_H_
#define GRADD_SERVER_ENGINE_OBSERVE_TIMELINE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/engine/observe/job_events.h"

namespace gradd {

class Timeline final : public JobEventSinkInterface {
 public:
  // Keeps the last `capacity` events (at least 1).
  explicit Timeline(size_t capacity);

  void OnBucket(const BucketEvent& event) override;
  // Rank restart (bucket -1): "restarting" (instant, on the rank) when a
  // rank went away; "rank_restarted" (the span it was away, on the rank)
  // when it came back, with "iteration_aborted" / "round_aborted"
  // (instants on the node; iteration: the iteration or round) for what its
  // return aborted.
  void OnRankRestarting(const RankRestartEvent& event) override;
  void OnRankRestarted(const RankRestartEvent& event) override;
  // Node loss and arrival (bucket -1, on the node): "network_broken"
  // (instant; iteration: the epoch left) when the job's group of nodes
  // broke, "network_reformed" (the span from the break to the re-formed
  // group; iteration: the new epoch) with "iteration_aborted" /
  // "round_aborted" for what the re-formation aborted.
  void OnNetworkBroken(const NetworkReformEvent& event) override;
  void OnNetworkReformed(const NetworkReformEvent& event) override;

  // The events in the ring, oldest first, times in Unix nanoseconds.
  std::vector<TimelineEvent> Snapshot() const;
  size_t capacity() const { return ring_.size(); }

 private:
  enum class Phase : uint8_t {
    kReady,
    kLocalReduce,
    kNetwork,
    kWriteBack,
    kDone,
    kRestarting,
    kRankRestarted,
    kIterationAborted,
    kRoundAborted,
    kNetworkBroken,
    kNetworkReformed
  };
  struct Entry {
    uint64_t iteration = 0;
    int32_t bucket = 0;
    int32_t local_rank = -1;
    Phase phase = Phase::kDone;
    int64_t start_ns = 0;  // engine clock
    int64_t duration_ns = 0;
  };
  void Push(const Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The instants of an abort at `at_ns` (a rank's return or a
  // re-formation): the aborted iteration and round, each when non-zero.
  void PushAborts(int64_t at_ns, uint64_t iteration, uint64_t round)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<Entry> ring_ ABSL_GUARDED_BY(mu_);
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_OBSERVE_TIMELINE_H_
