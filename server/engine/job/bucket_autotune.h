// Autotune of the bucket cap (`bucket_cap_mb: auto`, issue 36 point 4):
// after the bucket rebuild, the job tries a bounded list of caps, each for
// a few iterations, and keeps the one with the shortest step time.
//
//   waiting --Start(k, caps)--> tuning trial 1 --Next(k')--> trial 2 ...
//      |                          |                  --Next(k'')--> settled
//      |  one distinct plan only  +---- (after the last trial: the best     ^
//      +--------------------------------  cap, a final switch) -------------+
//   Stop(note) from waiting or tuning: off (the plan running stays).
//
// A trial is a plan switch (job/rebuild.h: every rank asks RebuildBuckets
// at the iteration the previous answer named, next_switch_after) followed
// by `warmup_iterations` iterations that are not measured (the first one
// after a switch pays for moving every gradient) and `measured_iterations`
// whose step times (observe/iteration_tracker.h: end of one iteration to
// the end of the next) are measured; the trial's score is their median.
// Settled is final: the cap never changes again, so a job pays for tuning
// once, within caps.size() + 1 switches and caps.size() * (warmup +
// measured) iterations.
//
// Multi-node jobs may tune the network partition size too (`partitions`,
// reduce/hierarchical_reducer.h's chunk bytes): a second stage after the
// caps, with the best cap, one trial per partition (the same switch and
// measure), then the best (cap, partition) pair; the bounds grow by
// partitions.size().
//
// Why a grid and not Horovod's Bayesian optimisation: the space is one
// dimension (two with the partition size) with a handful of settings
// worth telling apart (the step time is flat within a factor of two of the
// best cap), every sample is a whole training iteration, and a Gaussian
// process needs more samples than the few iterations a job should spend on
// tuning before it beats trying each setting once. A fixed grid is also
// the same on every node and easy to reason about from the log.
//
// Pure logic, no clock of its own: the engine's iteration events bring the
// times. Not thread-safe; Job's AutotuneRecord below wraps it for the
// threads that use it (the rebuild coordinator's, the completion thread,
// the control thread's snapshots).
#ifndef GRADD_SERVER_ENGINE_JOB_BUCKET_AUTOTUNE_H_
#define GRADD_SERVER_ENGINE_JOB_BUCKET_AUTOTUNE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gradd {

struct AutotuneOptions {
  // Candidate caps in bytes, tried in this order.
  std::vector<size_t> caps;
  // Candidate network partitions in bytes (0: whole buckets), tried with
  // the best cap after the caps; empty: the partition is not tuned.
  std::vector<size_t> partitions;
  int warmup_iterations = 1;
  int measured_iterations = 3;
  // Kept when no trial measured anything (e.g. every iteration was a join
  // round).
  size_t fallback_cap_bytes = 25 << 20;
};
// 1, 4, 10, 25 and 64 MiB: from latency-bound networks (small buckets
// overlap backward best) to bandwidth-bound ones (few large collectives).
AutotuneOptions DefaultAutotuneOptions();

class BucketAutotune {
 public:
  enum class State { kWaiting, kTuning, kSettled, kOff };
  // What the plan from the switch on uses, and when the next switch is.
  struct Setting {
    size_t cap_bytes = 0;
    uint64_t next_switch_after = 0;  // 0: settled (or off), no more switch
    int trial = 0;                   // 1-based while tuning, else 0
    int trials = 0;
    // The reducer's partition from the switch on (unset: unchanged).
    std::optional<size_t> partition_bytes;
  };
  struct Trial {
    size_t cap_bytes = 0;
    int64_t step_ns = 0;  // median of the measured iterations (0: none)
    int iterations = 0;
    std::optional<size_t> partition_bytes;
  };

  explicit BucketAutotune(AutotuneOptions options);

  const AutotuneOptions& options() const { return options_; }
  // The bucket rebuild after iteration k: the first trial (`caps`: the
  // options' caps that give distinct plans, in order). With one cap (or
  // none) there is nothing to try: settled at once on it.
  Setting Start(uint64_t k, std::vector<size_t> caps);
  // The step time of `iteration` (its end minus the previous one's);
  // counted when it is a measured iteration of the running trial.
  void OnStep(uint64_t iteration, int64_t step_ns);
  // The switch after iteration k (the setting's next_switch_after): the
  // running trial ends; the next trial, or the best cap and settled.
  Setting Next(uint64_t k);
  // Gives up (a rank skipped a switch, the job cannot rebuild): off.
  void Stop(std::string note);
  // Node rank 0 decided `setting` at the switch after iteration k; this
  // node follows it (multi-node, other nodes).
  void Follow(uint64_t k, const Setting& setting);

  State state() const { return state_; }
  const Setting& setting() const { return setting_; }
  const std::vector<Trial>& trials_done() const { return done_; }
  uint64_t settled_after() const { return settled_after_; }
  const std::string& note() const { return note_; }

 private:
  Setting TrialSetting(uint64_t k) const;
  // The trial whose step time is the lowest (the first of equals), or
  // null when none measured anything; among `from`.. of done_.
  const Trial* Best(size_t from) const;

  const AutotuneOptions options_;
  State state_ = State::kWaiting;
  std::vector<size_t> caps_;
  // Index of the running trial: caps_ first, then options_.partitions.
  size_t next_cap_ = 0;
  // The cap the partition trials run with.
  size_t best_cap_ = 0;
  Setting setting_;
  // The running trial's measured iterations: (first, last] and the times.
  uint64_t measure_after_ = 0;
  std::vector<int64_t> times_;
  std::vector<Trial> done_;
  uint64_t settled_after_ = 0;
  std::string note_;
};

const char* AutotuneStateName(BucketAutotune::State state);

// The plain copy the admin API and metrics show.
struct AutotuneSnapshot {
  BucketAutotune::State state = BucketAutotune::State::kWaiting;
  BucketAutotune::Setting setting;
  std::vector<BucketAutotune::Trial> trials_done;
  uint64_t settled_after = 0;
  bool decided_here = true;
  std::string note;
};

// A job's autotune, shared between the threads that use it: the rebuild
// coordinator's (Start / Next / Follow / Stop), the completion thread
// (OnStep, through the job's event sink) and the control thread
// (Snapshot).
class AutotuneRecord {
 public:
  explicit AutotuneRecord(AutotuneOptions options)
      : options_(options), tune_(std::move(options)) {}

  BucketAutotune::Setting Start(uint64_t k, std::vector<size_t> caps) {
    absl::MutexLock lock(&mu_);
    return tune_.Start(k, std::move(caps));
  }
  void OnStep(uint64_t iteration, int64_t step_ns) {
    absl::MutexLock lock(&mu_);
    tune_.OnStep(iteration, step_ns);
  }
  BucketAutotune::Setting Next(uint64_t k) {
    absl::MutexLock lock(&mu_);
    return tune_.Next(k);
  }
  void Follow(uint64_t k, const BucketAutotune::Setting& setting) {
    absl::MutexLock lock(&mu_);
    decided_here_ = false;
    tune_.Follow(k, setting);
  }
  void Stop(std::string note) {
    absl::MutexLock lock(&mu_);
    tune_.Stop(std::move(note));
  }
  BucketAutotune::State state() const {
    absl::MutexLock lock(&mu_);
    return tune_.state();
  }
  const AutotuneOptions& options() const { return options_; }
  AutotuneSnapshot Snapshot() const;

 private:
  const AutotuneOptions options_;
  mutable absl::Mutex mu_;
  BucketAutotune tune_ ABSL_GUARDED_BY(mu_);
  bool decided_here_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_BUCKET_AUTOTUNE_H_
