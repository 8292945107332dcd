// Job::Snapshot and the used-map record it reads (job.h); the snapshot's
// shape is engine/job/job_snapshot.h.
#include "server/engine/job/job_snapshot.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "server/engine/job/job.h"

namespace gradd {
namespace {

// A used map lists at most this many unused parameters (a model with more
// is reported by count only beyond it).
constexpr size_t kMaxUnusedListed = 100000;

// The admin view of `bucket`, done for `done_iteration` (0: not shown).
BucketSnapshot Describe(const Bucket& bucket, uint64_t done_iteration = 0) {
  return BucketSnapshot{bucket.dtype,  bucket.size_bytes, bucket.offset,
                        bucket.params, bucket.internal,   done_iteration};
}

}  // namespace

absl::string_view JobPhaseName(JobPhase phase) {
  switch (phase) {
    case JobPhase::kRunning:
      return "running";
    case JobPhase::kSwitchingPlan:
      return "switching_plan";
    case JobPhase::kDraining:
      return "draining";
    case JobPhase::kReforming:
      return "reforming";
    case JobPhase::kFailed:
      return "failed";
  }
  return "unknown";
}

int FindUsedMapParam(const std::vector<ParamInfo>& params) {
  if (params.size() < 2 || params[0].name != kUsedMapParameterName ||
      params[0].dtype != DType::kFloat32 ||
      params[0].numel() != params.size() - 1) {
    return -1;
  }
  return 0;
}

void Job::PublishPlan() {
  used_map_bucket_ = -1;
  if (used_map_param_ >= 0) {
    for (size_t b = 0; b < plan_.buckets.size(); ++b) {
      const Bucket& bucket = plan_.buckets[b];
      for (size_t i = 0; i < bucket.params.size(); ++i) {
        if (bucket.params[i] == used_map_param_) {
          used_map_bucket_ = static_cast<int>(b);
          used_map_offset_ = bucket.param_offsets[i];
        }
      }
    }
  }
  published_.PublishPlan(std::make_shared<const BucketPlan>(plan_));
}

void Job::RecordUsedMap(uint64_t iteration, const float* map) {
  const size_t n = spec_.params.size() - 1;
  std::vector<int32_t> unused;
  for (size_t i = 0; i < n; ++i) {
    if (!(map[i] > 0) && unused.size() < kMaxUnusedListed) {
      unused.push_back(static_cast<int32_t>(i + 1));
    }
  }
  published_.RecordUnused(iteration, std::move(unused));
}

JobSnapshot Job::Snapshot(bool detail) const {
  JobSnapshot s;
  s.job_id = spec_.job_id;
  s.local_world_size = spec_.local_world_size;
  PublishedState::Layout live = published_.layout();
  s.node_rank = live.node_rank;
  s.num_nodes = live.num_nodes;
  s.world_size = live.world_size;
  s.node_ids = std::move(live.node_ids);
  s.lost_node_ids = std::move(live.lost);
  s.last_reformation_reason = std::move(live.last_reason);
  s.phase = published_.phase();
  s.initial_num_nodes = spec_.num_nodes;
  s.initial_world_size = spec_.initial_global_world_size();
  s.min_nodes = spec_.min_nodes;
  s.epoch = epoch();
  s.rank_memory_bytes = rank_bytes_;
  s.broadcast_bytes = spec_.broadcast_bytes;
  s.planner = spec_.planner;
  if (autotune_ != nullptr) {
    s.autotune = autotune_->Snapshot();
    if (s.autotune->state != BucketAutotune::State::kWaiting &&
        s.autotune->setting.cap_bytes != 0) {
      s.planner.bucket_cap_bytes = s.autotune->setting.cap_bytes;
    }
  }
  s.has_used_map = used_map_param_ >= 0;
  for (int r = 0; r < spec_.local_world_size; ++r) {
    RankSnapshot rank;
    rank.local_rank = r;
    rank.global_rank = spec_.global_rank_offset + r;
    switch (ranks_.state(r)) {
      case RankStates::kLive:
        rank.state = RankSnapshot::State::kLive;
        break;
      case RankStates::kDetached:
        rank.state = RankSnapshot::State::kDetached;
        break;
      case RankStates::kRestarting:
        rank.state = RankSnapshot::State::kRestarting;
        break;
      default:
        rank.state = RankSnapshot::State::kDisconnected;
    }
    s.ranks.push_back(rank);
  }
  std::shared_ptr<const BucketPlan> plan = published_.plan();
  if (plan == nullptr) plan = std::make_shared<const BucketPlan>();
  PublishedState::UsedMap used = published_.used_map(detail);
  s.unused_iteration = used.iteration;
  s.ever_unused = used.ever_unused;
  if (detail) s.unused_params = std::move(used.unused);
  const std::atomic<uint64_t>* done = layout_.done_seq(control_.data());
  s.num_buckets = plan->buckets.size();
  s.iteration =
      plan->buckets.empty() ? 0 : std::numeric_limits<uint64_t>::max();
  for (size_t b = 0; b < plan->buckets.size(); ++b) {
    const Bucket& bucket = plan->buckets[b];
    const uint64_t d = done[b].load(std::memory_order_acquire);
    s.iteration = std::min(s.iteration, d);
    s.bucket_bytes += bucket.size_bytes;
    if (!detail) continue;
    s.buckets.push_back(Describe(bucket, d));
  }
  if (detail) {
    s.params = spec_.params;
    // spec_.plan is the plan the job formed with; plan_ replaces it in a
    // rebuild.
    if (!plan->buckets.empty() && !PlanSwitch::SameBuckets(spec_.plan, *plan)) {
      for (const Bucket& bucket : spec_.plan.buckets) {
        s.initial_buckets.push_back(Describe(bucket));
      }
    }
  }
  s.stats = reducer_stats();
  s.rank_restart_grace_ms =
      static_cast<uint32_t>(spec_.rank_restart_grace.count());
  s.restarts = restarts();
  s.iterations_aborted = iterations_aborted();
  s.status = status();
  s.state = s.status.ok() ? JobSnapshot::State::kRunning
                          : JobSnapshot::State::kFailed;
  return s;
}

}  // namespace gradd
