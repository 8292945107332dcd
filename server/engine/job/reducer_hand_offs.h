// What passes between a job's engine thread and its reducer's threads,
// besides the control block (job.h): the reducer itself, the count of work
// handed to it and not completed, and the result of a join round.
//
// ReducerSlot: the job's reducer. The engine thread is the only one that
// replaces it (a re-formation; null while the job re-forms) and calls it
// without locking (get(), the hot path); other threads read its totals
// and device description under the slot's lock. The totals of the
// reducers a re-formation retired are kept.
//
// ReducerHandOvers: every hand-over to the reducer counts itself in
// (Started, engine thread) until its completion (Done, any thread). While
// the engine drains (SetDraining), Done says whether it was the last one,
// so that the completion rings the engine; otherwise a completion costs
// one atomic decrement.
//
// JoinRoundResult: a join round's result, posted by the round's
// completion (any thread), taken by the engine (job_join.cc).
#ifndef GRADD_SERVER_ENGINE_JOB_REDUCER_HAND_OFFS_H_
#define GRADD_SERVER_ENGINE_JOB_REDUCER_HAND_OFFS_H_

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gradd/v1/node.pb.h"
#include "server/engine/reduce/bucket_reducer.h"

namespace gradd {

class ReducerSlot {
 public:
  explicit ReducerSlot(std::unique_ptr<BucketReducerInterface> reducer)
      : reducer_(std::move(reducer)) {}
  ReducerSlot(const ReducerSlot&) = delete;
  ReducerSlot& operator=(const ReducerSlot&) = delete;

  // Engine thread (and before the engine starts): the reducer, or null
  // while the job re-forms.
  BucketReducerInterface* get() const { return reducer_.get(); }
  BucketReducerInterface* operator->() const { return reducer_.get(); }
  // Engine thread: `reducer` (may be null) replaces the current one, whose
  // totals are kept and which is destroyed outside the lock (joining its
  // threads and closing its backend, bounded by its collective timeout).
  void Replace(std::unique_ptr<BucketReducerInterface> reducer);

  // Any thread: the totals of every reducer the job had.
  ReducerStats stats() const;
  // Any thread: BucketReducerInterface::DescribeDevice, nothing while the
  // job re-forms (the new reducer describes the devices the same way).
  void DescribeDevice(int rank, v1::AttachResponse* response) const;

 private:
  mutable absl::Mutex mu_;
  // Written by the engine thread under mu_; read by it without.
  std::unique_ptr<BucketReducerInterface> reducer_;
  ReducerStats retired_ ABSL_GUARDED_BY(mu_);
};

class ReducerHandOvers {
 public:
  // Engine thread: one more hand-over to the reducer.
  void Started() { count_.fetch_add(1); }
  // Its completion, any thread: true when it was the last one while the
  // engine drains (ring the engine).
  bool Done() {
    // seq_cst with SetDraining's store and count()'s load: either the
    // engine sees the count at 0 or this completion sees it draining.
    return count_.fetch_sub(1) == 1 && draining_.load();
  }
  // Hand-overs whose completion has not run yet.
  int count() const { return count_.load(); }
  // Engine thread: a drain begins / ends.
  void SetDraining(bool draining) { draining_.store(draining); }

 private:
  std::atomic<int> count_{0};
  std::atomic<bool> draining_{false};
};

class JoinRoundResult {
 public:
  struct Result {
    absl::Status status;
    std::vector<double> values;  // the summed round vector
  };
  // The round's completion, any thread.
  void Post(absl::Status status, std::vector<double> values);
  // Engine thread: the result, once (nullopt: not there yet).
  std::optional<Result> Take();

 private:
  absl::Mutex mu_;
  std::optional<Result> result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_REDUCER_HAND_OFFS_H_
