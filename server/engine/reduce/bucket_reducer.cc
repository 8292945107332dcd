#include "server/engine/reduce/bucket_reducer.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/reduce.h"
#include "common/split_across_pool.h"
#include "server/engine/reduce/area_collective.h"

namespace gradd {

void FusedReducer::Start(const BucketWork& work, Completion done) {
  const int64_t start = EngineNowNs();
  const std::vector<void*>& buffers = *work.rank_buffers;
  const int n = static_cast<int>(buffers.size());
  absl::Status status;
  if (hook_ != nullptr && !work.internal) {
    CommHookWork hook_work;
    hook_work.bucket = work.bucket;
    hook_work.iteration = work.iteration;
    hook_work.dtype = work.dtype;
    hook_work.count = work.count;
    hook_work.rank_buffers = work.rank_buffers;
    status = hook_->Run(hook_work, single_node_);
  } else {
    SplitAcrossPool(pool_, work.dtype, 0, work.count,
                    [&](size_t begin, size_t end) {
                      FusedAverage(work.dtype, buffers.data(), n, begin, end,
                                   work.divisor > 0 ? work.divisor : divisor_);
                    });
  }
  const int64_t ns = EngineNowNs() - start;
  if (work.timing != nullptr) work.timing->local_reduce.Add(start, ns);
  reduce_ns_.fetch_add(ns, std::memory_order_relaxed);
  buckets_.fetch_add(1, std::memory_order_relaxed);
  std::move(done)(std::move(status));
}

void BucketReducerInterface::StartBroadcast(const BroadcastWork& work,
                                            Completion done) {
  if (work.kind != CollectiveKind::kBroadcast) {
    // Single node: the local halves are the whole round. The scratch is
    // per round: collectives are rare next to buckets, and a member would
    // pin up to the largest area for the reducer's life.
    std::vector<char> scratch;
    RunLocalAreaCollective(work, &scratch);
    std::move(done)(absl::OkStatus());
    return;
  }
  // Single node: global rank == local rank.
  const std::vector<void*>& areas = *work.rank_areas;
  if (work.root < 0 || static_cast<size_t>(work.root) >= areas.size() ||
      areas[work.root] == nullptr) {
    std::move(done)(absl::InternalError(
        absl::StrCat("broadcast ", work.seq, ": root rank ", work.root,
                     " does not take part on this node")));
    return;
  }
  for (size_t r = 0; r < areas.size(); ++r) {
    if (static_cast<int>(r) == work.root || areas[r] == nullptr) continue;
    std::memcpy(areas[r], areas[work.root], work.bytes);
  }
  std::move(done)(absl::OkStatus());
}

void BucketReducerInterface::StartJoinRound(JoinRoundWork work,
                                            RoundCompletion done) {
  std::move(done)(absl::OkStatus(), std::move(work.values));
}

ReducerStats FusedReducer::stats() const {
  ReducerStats s;
  s.buckets = buckets_.load(std::memory_order_relaxed);
  s.local_reduce_ns = reduce_ns_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace gradd
