#include "server/engine/job/rank_states.h"

#include <utility>

namespace gradd {

RankStates::RankStates(int world)
    : world_(world),
      states_(new std::atomic<int>[world]),
      since_ns_(new std::atomic<int64_t>[world]) {
  for (int r = 0; r < world; ++r) {
    states_[r].store(kLive);
    since_ns_[r].store(0);
  }
}

RankStates::State RankStates::Gone(int rank, bool detached) {
  const int target = detached ? kDetached : kDisconnected;
  int s = states_[rank].load();
  while (s == kLive || s == kRestarting) {
    if (states_[rank].compare_exchange_weak(s, target)) break;
  }
  return static_cast<State>(s);
}

bool RankStates::BeginRestart(int rank, int64_t now_ns) {
  int expected = kLive;
  if (!states_[rank].compare_exchange_strong(expected, kRestarting)) {
    return false;
  }
  // Read only once the rank is back, which its restart's caller posts
  // after this returns (Job::RestartRank).
  since_ns_[rank].store(now_ns, std::memory_order_relaxed);
  return true;
}

bool RankStates::EndRestart(int rank) {
  int expected = kRestarting;
  return states_[rank].compare_exchange_strong(expected, kLive);
}

void RankRestartInbox::Post(int rank, RankRestartDone done) {
  std::optional<absl::Status> refused;
  {
    absl::MutexLock lock(&mu_);
    if (closed_.has_value()) {
      refused = closed_;
    } else {
      requests_.push_back(Request{rank, std::move(done)});
      set_pending(true);
    }
  }
  if (refused.has_value()) {
    std::move(done)(*std::move(refused));
    return;
  }
  Wake();
}

std::vector<RankRestartInbox::Request> RankRestartInbox::TakeAll() {
  return TakeSlot(&mu_, &requests_);
}

void RankRestartInbox::FailAll(const absl::Status& status) {
  // Answered outside the lock: an answer may post again.
  for (Request& r : TakeAll()) std::move(r.done)(status);
}

void RankRestartInbox::Close(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    closed_ = status;
  }
  FailAll(status);
}

}  // namespace gradd
