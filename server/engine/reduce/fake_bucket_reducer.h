// FakeBucketReducer: a BucketReducerInterface (bucket_reducer.h) for tests
// of the engine above reduce/ (job/, manager/). It reduces nothing: it
// records every hand-over in a FakeReductions log the test keeps (shared,
// so the log outlives the reducer and says whether the engine destroyed
// it), and each bucket completes only when the test finishes it, from the
// test's thread -- the contract the multi-node (network-thread) reducer
// relies on.
//
// Tests only: header-only, in the CMake target gradd_engine_reduce_testing,
// which no library of the daemon links.
#ifndef GRADD_SERVER_ENGINE_REDUCE_FAKE_BUCKET_REDUCER_H_
#define GRADD_SERVER_ENGINE_REDUCE_FAKE_BUCKET_REDUCER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/device.h"
#include "server/engine/reduce/bucket_reducer.h"

namespace gradd {

// What FakeBucketReducers were handed, in order. Thread-safe.
class FakeReductions {
 public:
  // One hand-over: a bucket (Start), a collective round (StartBroadcast) or
  // a join round (StartJoinRound), with what the test may check of it.
  struct Work {
    enum Kind { kBucket, kBroadcast, kRound };
    Kind kind = kBucket;
    int bucket = -1;  // -1: not a bucket
    // The bucket's or join round's iteration; a collective round's seq.
    uint64_t iteration = 0;
    size_t count = 0;  // elements (buckets)
    DeviceKind device = DeviceKind::kCpu;
    std::vector<void*> buffers;  // the bucket's rank_buffers
    double divisor = 0;
    BucketReducerInterface::Completion done;
    BucketReducerInterface::RoundCompletion round_done;
  };

  // Waits (bounded) until `n` hand-overs were made in total.
  bool WaitStarted(size_t n, absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return started_.size() >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  // How many hand-overs were made.
  size_t size() {
    absl::MutexLock lock(&mu_);
    return started_.size();
  }
  // The k-th hand-over's bucket and iteration.
  std::pair<int, uint64_t> at(size_t k) {
    absl::MutexLock lock(&mu_);
    return {started_.at(k).bucket, started_.at(k).iteration};
  }
  size_t elements(size_t k) {
    absl::MutexLock lock(&mu_);
    return started_.at(k).count;
  }
  double divisor(size_t k) {
    absl::MutexLock lock(&mu_);
    return started_.at(k).divisor;
  }
  std::pair<DeviceKind, std::vector<void*>> buffers(size_t k) {
    absl::MutexLock lock(&mu_);
    return {started_.at(k).device, started_.at(k).buffers};
  }
  // Completes the k-th hand-over with `s` (a join round with no values).
  void Finish(size_t k, absl::Status s = absl::OkStatus()) {
    BucketReducerInterface::Completion done;
    BucketReducerInterface::RoundCompletion round_done;
    {
      absl::MutexLock lock(&mu_);
      done = std::move(started_.at(k).done);
      round_done = std::move(started_.at(k).round_done);
    }
    if (done) std::move(done)(std::move(s));
    if (round_done) std::move(round_done)(std::move(s), {});
  }
  // Waits (bounded) until `n` hand-overs were made since the last Take,
  // and hands every one made since then to the caller (who completes them).
  std::vector<Work> Take(size_t n, absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return started_.size() - taken_ >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    std::vector<Work> out;
    for (; taken_ < started_.size(); ++taken_) {
      out.push_back(std::move(started_[taken_]));
    }
    return out;
  }
  // Replan(first_iteration, num_buckets) calls, in order.
  std::vector<std::pair<uint64_t, int>> replans() {
    absl::MutexLock lock(&mu_);
    return replans_;
  }
  // SetPartitionBytes(first_iteration, bytes) calls, in order.
  std::vector<std::pair<uint64_t, size_t>> partitions() {
    absl::MutexLock lock(&mu_);
    return partitions_;
  }
  // AgreeCommHook's descriptions, in order.
  std::vector<std::string> agreed_hooks() {
    absl::MutexLock lock(&mu_);
    return agreed_;
  }
  // Whether a reducer recording here was destroyed.
  bool is_destroyed() {
    absl::MutexLock lock(&mu_);
    return destroyed_;
  }

 private:
  friend class FakeBucketReducer;

  void Add(Work work) {
    absl::MutexLock lock(&mu_);
    started_.push_back(std::move(work));
  }

  absl::Mutex mu_;
  std::vector<Work> started_ ABSL_GUARDED_BY(mu_);
  size_t taken_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<uint64_t, int>> replans_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, size_t>> partitions_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> agreed_ ABSL_GUARDED_BY(mu_);
  bool destroyed_ ABSL_GUARDED_BY(mu_) = false;
};

class FakeBucketReducer final : public BucketReducerInterface {
 public:
  // `multi_node`: collective and join rounds are recorded and wait for the
  // test too, as a multi-node reducer's go over the network; otherwise
  // they run as the interface's single-node defaults do (inline).
  explicit FakeBucketReducer(std::shared_ptr<FakeReductions> log,
                             bool multi_node = false)
      : log_(std::move(log)), multi_node_(multi_node) {}
  ~FakeBucketReducer() override {
    absl::MutexLock lock(&log_->mu_);
    log_->destroyed_ = true;
  }

  void Start(const BucketWork& work, Completion done) override {
    FakeReductions::Work w;
    w.bucket = work.bucket;
    w.iteration = work.iteration;
    w.count = work.count;
    w.device = work.device;
    if (work.rank_buffers != nullptr) w.buffers = *work.rank_buffers;
    w.divisor = work.divisor;
    w.done = std::move(done);
    log_->Add(std::move(w));
  }
  void StartBroadcast(const BroadcastWork& work, Completion done) override {
    if (!multi_node_) {
      BucketReducerInterface::StartBroadcast(work, std::move(done));
      return;
    }
    FakeReductions::Work w;
    w.kind = FakeReductions::Work::kBroadcast;
    w.iteration = work.seq;
    w.done = std::move(done);
    log_->Add(std::move(w));
  }
  void StartJoinRound(JoinRoundWork work, RoundCompletion done) override {
    if (!multi_node_) {
      BucketReducerInterface::StartJoinRound(std::move(work), std::move(done));
      return;
    }
    FakeReductions::Work w;
    w.kind = FakeReductions::Work::kRound;
    w.iteration = work.iteration;
    w.round_done = std::move(done);
    log_->Add(std::move(w));
  }
  void Replan(uint64_t first_iteration, int num_buckets) override {
    absl::MutexLock lock(&log_->mu_);
    log_->replans_.push_back({first_iteration, num_buckets});
  }
  void SetPartitionBytes(uint64_t first_iteration, size_t bytes) override {
    absl::MutexLock lock(&log_->mu_);
    log_->partitions_.push_back({first_iteration, bytes});
  }
  absl::Status AgreeCommHook(const std::string& description) override {
    absl::MutexLock lock(&log_->mu_);
    log_->agreed_.push_back(description);
    return absl::OkStatus();
  }

 private:
  const std::shared_ptr<FakeReductions> log_;
  const bool multi_node_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_REDUCE_FAKE_BUCKET_REDUCER_H_
