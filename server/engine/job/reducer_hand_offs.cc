#include "server/engine/job/reducer_hand_offs.h"

#include <utility>

namespace gradd {
namespace {

void Add(ReducerStats* to, const ReducerStats& s) {
  to->buckets += s.buckets;
  to->local_reduce_ns += s.local_reduce_ns;
  to->network_ns += s.network_ns;
  to->write_back_ns += s.write_back_ns;
}

}  // namespace

void ReducerSlot::Replace(std::unique_ptr<BucketReducerInterface> reducer) {
  std::unique_ptr<BucketReducerInterface> old;
  {
    absl::MutexLock lock(&mu_);
    if (reducer_ != nullptr) Add(&retired_, reducer_->stats());
    old = std::move(reducer_);
    reducer_ = std::move(reducer);
  }
  old.reset();
}

ReducerStats ReducerSlot::stats() const {
  absl::MutexLock lock(&mu_);
  ReducerStats s = retired_;
  if (reducer_ != nullptr) Add(&s, reducer_->stats());
  return s;
}

void ReducerSlot::DescribeDevice(int rank, v1::AttachResponse* response) const {
  absl::MutexLock lock(&mu_);
  if (reducer_ != nullptr) reducer_->DescribeDevice(rank, response);
}

void JoinRoundResult::Post(absl::Status status, std::vector<double> values) {
  absl::MutexLock lock(&mu_);
  result_ = Result{std::move(status), std::move(values)};
}

std::optional<JoinRoundResult::Result> JoinRoundResult::Take() {
  std::optional<Result> taken;
  absl::MutexLock lock(&mu_);
  taken.swap(result_);
  return taken;
}

}  // namespace gradd
