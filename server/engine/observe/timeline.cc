#include "server/engine/observe/timeline.h"

#include <algorithm>

namespace gradd {
namespace {

const char* PhaseName(int phase) {
  static const char* const kNames[] = {
      "ready",         "local_reduce",   "network",         "write_back",
      "done",          "restarting",     "rank_restarted",  "iteration_aborted",
      "round_aborted", "network_broken", "network_reformed"};
  return kNames[phase];
}

}  // namespace

Timeline::Timeline(size_t capacity) : ring_(std::max<size_t>(1, capacity)) {}

void Timeline::Push(const Entry& entry) {
  ring_[written_ % ring_.size()] = entry;
  ++written_;
}

void Timeline::OnBucket(const BucketEvent& e) {
  Entry entry;
  entry.iteration = e.iteration;
  entry.bucket = e.bucket;
  absl::MutexLock lock(&mu_);
  entry.phase = Phase::kReady;
  for (size_t r = 0; r < e.rank_ready_ns.size(); ++r) {
    const int64_t ready = e.rank_ready_ns[r];
    if (ready == 0) continue;
    entry.local_rank = static_cast<int32_t>(r);
    entry.start_ns = ready;
    entry.duration_ns = std::max<int64_t>(0, e.start_ns - ready);
    Push(entry);
  }
  entry.local_rank = -1;
  auto phase = [&](Phase p, const PhaseSpan& span) {
    if (span.start_ns == 0) return;
    entry.phase = p;
    entry.start_ns = span.start_ns;
    entry.duration_ns = span.duration_ns;
    Push(entry);
  };
  phase(Phase::kLocalReduce, e.phases.local_reduce);
  phase(Phase::kNetwork, e.phases.network);
  phase(Phase::kWriteBack, e.phases.write_back);
  entry.phase = Phase::kDone;
  entry.start_ns = e.done_ns;
  entry.duration_ns = 0;
  Push(entry);
}

void Timeline::OnRankRestarting(const RankRestartEvent& e) {
  Entry entry;
  entry.bucket = -1;
  entry.local_rank = e.local_rank;
  entry.phase = Phase::kRestarting;
  entry.start_ns = e.at_ns;
  absl::MutexLock lock(&mu_);
  Push(entry);
}

void Timeline::OnRankRestarted(const RankRestartEvent& e) {
  Entry entry;
  entry.bucket = -1;
  entry.local_rank = e.local_rank;
  entry.phase = Phase::kRankRestarted;
  // The span the rank was away.
  entry.start_ns = e.since_ns != 0 ? e.since_ns : e.at_ns;
  entry.duration_ns = std::max<int64_t>(0, e.at_ns - entry.start_ns);
  absl::MutexLock lock(&mu_);
  Push(entry);
  PushAborts(e.at_ns, e.aborted_iteration, e.aborted_round);
}

void Timeline::PushAborts(int64_t at_ns, uint64_t iteration, uint64_t round) {
  Entry entry;
  entry.bucket = -1;
  entry.local_rank = -1;
  entry.start_ns = at_ns;
  if (iteration != 0) {
    entry.phase = Phase::kIterationAborted;
    entry.iteration = iteration;
    Push(entry);
  }
  if (round != 0) {
    entry.phase = Phase::kRoundAborted;
    entry.iteration = round;
    Push(entry);
  }
}

void Timeline::OnNetworkBroken(const NetworkReformEvent& e) {
  Entry entry;
  entry.bucket = -1;
  entry.local_rank = -1;
  entry.phase = Phase::kNetworkBroken;
  entry.iteration = e.epoch;
  entry.start_ns = e.broke_ns != 0 ? e.broke_ns : e.at_ns;
  absl::MutexLock lock(&mu_);
  Push(entry);
}

void Timeline::OnNetworkReformed(const NetworkReformEvent& e) {
  Entry entry;
  entry.bucket = -1;
  entry.local_rank = -1;
  entry.phase = Phase::kNetworkReformed;
  entry.iteration = e.epoch;
  // The span the job waited for its nodes to agree.
  entry.start_ns = e.broke_ns != 0 ? e.broke_ns : e.at_ns;
  entry.duration_ns = std::max<int64_t>(0, e.at_ns - entry.start_ns);
  absl::MutexLock lock(&mu_);
  Push(entry);
  PushAborts(e.at_ns, e.aborted_iteration, e.aborted_round);
}

std::vector<TimelineEvent> Timeline::Snapshot() const {
  absl::MutexLock lock(&mu_);
  const uint64_t n = std::min<uint64_t>(written_, ring_.size());
  std::vector<TimelineEvent> out;
  out.reserve(n);
  for (uint64_t i = written_ - n; i < written_; ++i) {
    const Entry& entry = ring_[i % ring_.size()];
    TimelineEvent e;
    e.iteration = entry.iteration;
    e.bucket = entry.bucket;
    e.local_rank = entry.local_rank;
    e.phase = PhaseName(static_cast<int>(entry.phase));
    e.start_unix_ns = EngineToUnixNs(entry.start_ns);
    e.duration_ns = entry.duration_ns;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace gradd
