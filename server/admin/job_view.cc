#include "server/admin/job_view.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace gradd {
namespace {

v1::JobState StateOf(JobSnapshot::State s) {
  switch (s) {
    case JobSnapshot::State::kPending:
      return v1::JOB_STATE_PENDING;
    case JobSnapshot::State::kForming:
      return v1::JOB_STATE_FORMING;
    case JobSnapshot::State::kRunning:
      return v1::JOB_STATE_RUNNING;
    case JobSnapshot::State::kFailed:
      return v1::JOB_STATE_FAILED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

v1::RankState StateOf(RankSnapshot::State s) {
  switch (s) {
    case RankSnapshot::State::kAttaching:
      return v1::RANK_STATE_ATTACHING;
    case RankSnapshot::State::kLive:
      return v1::RANK_STATE_LIVE;
    case RankSnapshot::State::kDetached:
      return v1::RANK_STATE_DETACHED;
    case RankSnapshot::State::kDisconnected:
      return v1::RANK_STATE_DISCONNECTED;
    case RankSnapshot::State::kRestarting:
      return v1::RANK_STATE_RESTARTING;
  }
  return v1::RANK_STATE_UNSPECIFIED;
}

// torch's names for dtypes in its logging data (c10 scalar type names).
std::string TorchDTypeName(DType d) {
  switch (d) {
    case DType::kFloat32:
      return "float";
    case DType::kFloat64:
      return "double";
    case DType::kFloat16:
      return "c10::Half";
    case DType::kBFloat16:
      return "c10::BFloat16";
  }
  return std::string(DTypeName(d));
}

// Model parameter index (torch's: gradd's own parameters left out) of each
// of the job's parameters, -1 for gradd's own.
std::vector<int> ModelIndices(const std::vector<ParamInfo>& params) {
  std::vector<int> out;
  int next = 0;
  for (const ParamInfo& p : params) {
    out.push_back(IsInternalParam(p.name) ? -1 : next++);
  }
  return out;
}

// Per bucket holding model parameters: the bytes of those parameters, and
// their model indices.
void ModelBuckets(const std::vector<ParamInfo>& params,
                  const std::vector<BucketSnapshot>& buckets,
                  std::vector<size_t>* sizes,
                  std::vector<std::vector<int>>* indices) {
  const std::vector<int> model = ModelIndices(params);
  for (const BucketSnapshot& b : buckets) {
    size_t bytes = 0;
    std::vector<int> idx;
    for (int32_t p : b.params) {
      if (p < 0 || static_cast<size_t>(p) >= params.size() || model[p] < 0) {
        continue;
      }
      bytes += params[p].bytes();
      idx.push_back(model[p]);
    }
    if (idx.empty()) continue;
    sizes->push_back(bytes);
    indices->push_back(std::move(idx));
  }
}

int PhaseRank(const std::string& phase) {
  static const char* const kOrder[] = {"ready", "local_reduce", "network",
                                       "write_back", "done"};
  for (int i = 0; i < 5; ++i) {
    if (phase == kOrder[i]) return i;
  }
  return 5;
}

v1::JobPhase PhaseOf(JobPhase phase) {
  switch (phase) {
    case JobPhase::kRunning:
      return v1::JOB_PHASE_RUNNING;
    case JobPhase::kSwitchingPlan:
      return v1::JOB_PHASE_SWITCHING_PLAN;
    case JobPhase::kDraining:
      return v1::JOB_PHASE_DRAINING;
    case JobPhase::kReforming:
      return v1::JOB_PHASE_REFORMING;
    case JobPhase::kFailed:
      return v1::JOB_PHASE_FAILED;
  }
  return v1::JOB_PHASE_UNSPECIFIED;
}

}  // namespace

namespace {

v1::BucketAutotune AutotuneOf(const AutotuneSnapshot& a) {
  v1::BucketAutotune out;
  switch (a.state) {
    case BucketAutotune::State::kWaiting:
      out.set_state(v1::BucketAutotune::STATE_WAITING);
      break;
    case BucketAutotune::State::kTuning:
      out.set_state(v1::BucketAutotune::STATE_TUNING);
      break;
    case BucketAutotune::State::kSettled:
      out.set_state(v1::BucketAutotune::STATE_SETTLED);
      break;
    case BucketAutotune::State::kOff:
      out.set_state(v1::BucketAutotune::STATE_OFF);
      break;
  }
  out.set_bucket_cap_bytes(a.setting.cap_bytes);
  out.set_trial(static_cast<uint32_t>(a.setting.trial));
  out.set_trials(static_cast<uint32_t>(a.setting.trials));
  out.set_settled_after(a.settled_after);
  out.set_decided_here(a.decided_here);
  for (const BucketAutotune::Trial& t : a.trials_done) {
    v1::BucketAutotune::Trial* o = out.add_trials_done();
    o->set_bucket_cap_bytes(t.cap_bytes);
    o->set_step_ns(t.step_ns);
    o->set_iterations(static_cast<uint32_t>(t.iterations));
    if (t.partition_bytes.has_value()) {
      o->set_partition_bytes(*t.partition_bytes);
    }
  }
  if (a.setting.partition_bytes.has_value()) {
    out.set_partition_bytes(*a.setting.partition_bytes);
  }
  out.set_note(a.note);
  return out;
}

}  // namespace

v1::JobSummary JobSummaryOf(const JobSnapshot& job) {
  v1::JobSummary s;
  s.set_job_id(job.job_id);
  s.set_state(StateOf(job.state));
  if (job.state == JobSnapshot::State::kRunning ||
      job.state == JobSnapshot::State::kFailed) {
    s.set_phase(PhaseOf(job.phase));
  }
  s.set_local_world_size(job.local_world_size);
  int live = 0;
  for (const RankSnapshot& r : job.ranks) {
    live += r.state == RankSnapshot::State::kLive ||
            r.state == RankSnapshot::State::kAttaching;
  }
  s.set_live_local_ranks(live);
  s.set_num_nodes(job.num_nodes);
  s.set_node_rank(job.node_rank);
  s.set_world_size(job.world_size);
  s.set_iteration(job.iteration);
  s.set_num_buckets(job.num_buckets);
  s.set_bucket_bytes(job.bucket_bytes);
  if (!job.status.ok()) s.set_error(job.status.ToString());
  int restarting = 0;
  for (const RankSnapshot& r : job.ranks) {
    restarting += r.state == RankSnapshot::State::kRestarting;
  }
  s.set_rank_restart_grace_ms(job.rank_restart_grace_ms);
  s.set_restarting_local_ranks(restarting);
  s.set_restarts(job.restarts);
  s.set_iterations_aborted(job.iterations_aborted);
  s.set_min_nodes(job.min_nodes);
  s.set_epoch(job.epoch);
  for (const std::string& id : job.node_ids) s.add_live_node_ids(id);
  for (const std::string& id : job.lost_node_ids) s.add_lost_node_ids(id);
  s.set_last_reformation_reason(job.last_reformation_reason);
  // The deprecated field keeps the same text for one release
  // (docs/deprecations.md).
  s.set_last_reform_reason(job.last_reformation_reason);
  s.set_initial_num_nodes(job.initial_num_nodes);
  s.set_initial_world_size(job.initial_world_size);
  if (job.autotune.has_value())
    *s.mutable_autotune() = AutotuneOf(*job.autotune);
  return s;
}

v1::DdpLoggingData DdpLoggingDataOf(const JobSnapshot& job) {
  v1::DdpLoggingData d;
  d.set_backend_name("gradd");
  d.set_world_size(job.world_size);
  d.set_bucket_cap_bytes(job.planner.bucket_cap_bytes);
  d.set_gradd_first_bucket_cap_bytes(job.planner.first_bucket_cap_bytes);
  d.set_gradient_as_bucket_view(1);
  d.set_iteration(job.iteration);
  d.set_has_rebuilt_buckets(job.rebuilt ? 1 : 0);
  d.set_num_buckets_reduced(job.stats.buckets);

  std::vector<std::string> dtypes;
  int64_t tensors = 0;
  int64_t bytes = 0;
  for (const ParamInfo& p : job.params) {
    if (IsInternalParam(p.name)) continue;
    ++tensors;
    bytes += p.bytes();
    std::string name = TorchDTypeName(p.dtype);
    if (std::find(dtypes.begin(), dtypes.end(), name) == dtypes.end()) {
      dtypes.push_back(std::move(name));
    }
  }
  d.set_dtypes(absl::StrJoin(dtypes, ", "));
  d.set_num_parameter_tensors(tensors);
  d.set_total_parameter_size_bytes(bytes);

  std::vector<size_t> sizes;
  std::vector<std::vector<int>> indices;
  ModelBuckets(job.params,
               job.initial_buckets.empty() ? job.buckets : job.initial_buckets,
               &sizes, &indices);
  d.set_bucket_sizes(absl::StrJoin(sizes, ", "));
  if (job.rebuilt) {
    sizes.clear();
    indices.clear();
    ModelBuckets(job.params, job.buckets, &sizes, &indices);
    d.set_rebuilt_bucket_sizes(absl::StrJoin(sizes, ", "));
    std::vector<std::string> per_bucket;
    for (const auto& idx : indices)
      per_bucket.push_back(absl::StrJoin(idx, " "));
    d.set_rebuilt_per_bucket_param_indices(absl::StrJoin(per_bucket, ", "));
  }
  if (job.has_used_map) {
    int64_t unused = 0;
    for (int32_t p : job.unused_params) {
      if (p >= 0 && static_cast<size_t>(p) < job.params.size()) {
        unused += job.params[p].bytes();
      }
    }
    d.set_unused_parameter_size(unused);
    d.set_can_set_static_graph(job.ever_unused ? 0 : 1);
  }
  return d;
}

v1::JobDetail JobDetailOf(const JobSnapshot& job, const std::string& node_id) {
  v1::JobDetail d;
  *d.mutable_summary() = JobSummaryOf(job);
  for (const RankSnapshot& r : job.ranks) {
    v1::RankInfo* rank = d.add_ranks();
    rank->set_local_rank(r.local_rank);
    rank->set_global_rank(r.global_rank);
    rank->set_state(StateOf(r.state));
    rank->set_pid(r.pid);
    rank->set_uid(r.uid);
    if (r.state == RankSnapshot::State::kRestarting &&
        r.restart_deadline_unix_ns != 0) {
      rank->set_restart_deadline_unix_ns(r.restart_deadline_unix_ns);
      rank->set_restart_ms_left(std::max<int64_t>(
          0, (r.restart_deadline_unix_ns - absl::GetCurrentTimeNanos()) /
                 1'000'000));
    }
  }
  if (!job.node_ids.empty()) {
    for (size_t n = 0; n < job.node_ids.size(); ++n) {
      v1::NodeInfo* node = d.add_nodes();
      node->set_node_rank(static_cast<int>(n));
      node->set_node_id(job.node_ids[n]);
    }
  } else {
    v1::NodeInfo* node = d.add_nodes();
    node->set_node_rank(job.node_rank);
    node->set_node_id(node_id);
  }
  std::vector<int> bucket_of(job.params.size(), -1);
  v1::PlanInfo* plan = d.mutable_plan();
  plan->set_first_bucket_cap_bytes(job.planner.first_bucket_cap_bytes);
  plan->set_bucket_cap_bytes(job.planner.bucket_cap_bytes);
  plan->set_rank_memory_bytes(job.rank_memory_bytes);
  plan->set_broadcast_bytes(job.broadcast_bytes);
  for (size_t b = 0; b < job.buckets.size(); ++b) {
    const BucketSnapshot& in = job.buckets[b];
    v1::BucketInfo* out = plan->add_buckets();
    out->set_index(static_cast<int>(b));
    out->set_dtype(std::string(DTypeName(in.dtype)));
    out->set_size_bytes(in.size_bytes);
    out->set_offset(in.offset);
    for (int32_t p : in.params) {
      out->add_params(p);
      if (p >= 0 && static_cast<size_t>(p) < bucket_of.size()) {
        bucket_of[p] = static_cast<int>(b);
      }
    }
    out->set_internal(in.internal);
    out->set_done_iteration(in.done_iteration);
  }
  for (size_t i = 0; i < job.params.size(); ++i) {
    const ParamInfo& p = job.params[i];
    v1::ParameterInfo* out = d.add_parameters();
    out->set_name(p.name);
    for (int64_t dim : p.shape) out->add_shape(dim);
    out->set_dtype(std::string(DTypeName(p.dtype)));
    out->set_bucket(bucket_of[i]);
  }
  v1::ReducerTotals* totals = d.mutable_totals();
  totals->set_buckets_reduced(job.stats.buckets);
  totals->set_local_reduce_ns(job.stats.local_reduce_ns);
  totals->set_network_ns(job.stats.network_ns);
  totals->set_write_back_ns(job.stats.write_back_ns);
  d.set_rebuilt(job.rebuilt);
  d.set_rebuild_iteration(job.rebuild_iteration);
  for (int32_t p : job.rebuild_ready_order) d.add_rebuild_ready_order(p);
  d.set_used_map(job.has_used_map);
  d.set_unused_iteration(job.unused_iteration);
  for (int32_t p : job.unused_params) {
    if (p >= 0 && static_cast<size_t>(p) < job.params.size()) {
      d.add_unused_parameters(job.params[p].name);
    }
  }
  *d.mutable_ddp_logging_data() = DdpLoggingDataOf(job);
  return d;
}

std::vector<v1::BucketTiming> BucketTimingsOf(
    const std::vector<v1::TraceEvent>& events) {
  struct Acc {
    uint64_t count = 0;
    int64_t total = 0;
    int64_t max = 0;
    uint64_t last_iteration = 0;
    int64_t last = 0;
  };
  // bucket -> (phase order, phase) -> figures
  std::map<int, std::map<std::pair<int, std::string>, Acc>> acc;
  for (const v1::TraceEvent& e : events) {
    if (e.bucket() < 0) continue;  // rank restart events: no bucket's
    Acc& a = acc[e.bucket()][{PhaseRank(e.phase()), e.phase()}];
    ++a.count;
    a.total += e.duration_ns();
    a.max = std::max(a.max, e.duration_ns());
    if (a.count == 1 || e.iteration() >= a.last_iteration) {
      a.last_iteration = e.iteration();
      a.last = e.duration_ns();
    }
  }
  std::vector<v1::BucketTiming> out;
  for (const auto& [bucket, phases] : acc) {
    v1::BucketTiming t;
    t.set_bucket(bucket);
    for (const auto& [key, a] : phases) {
      v1::PhaseTiming* p = t.add_phases();
      p->set_phase(key.second);
      p->set_count(a.count);
      p->set_total_ns(a.total);
      p->set_last_ns(a.last);
      p->set_max_ns(a.max);
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<int32_t> ReadyOrderOf(const std::vector<v1::TraceEvent>& events) {
  std::map<int, bool> buckets;  // every bucket seen
  // iteration -> bucket -> (ready end, first node phase start, done seen)
  struct Seen {
    int64_t ready_end = std::numeric_limits<int64_t>::min();
    int64_t node_start = std::numeric_limits<int64_t>::max();
    bool done = false;
  };
  std::map<uint64_t, std::map<int, Seen>> by_iteration;
  for (const v1::TraceEvent& e : events) {
    if (e.bucket() < 0) continue;  // rank restart events: no bucket's
    buckets[e.bucket()] = true;
    Seen& s = by_iteration[e.iteration()][e.bucket()];
    if (e.phase() == "ready") {
      s.ready_end = std::max(s.ready_end, e.start_unix_ns() + e.duration_ns());
    } else {
      s.node_start = std::min(s.node_start, e.start_unix_ns());
      s.done |= e.phase() == "done";
    }
  }
  for (auto it = by_iteration.rbegin(); it != by_iteration.rend(); ++it) {
    const std::map<int, Seen>& seen = it->second;
    bool complete = seen.size() == buckets.size();
    for (const auto& [b, s] : seen) complete &= s.done;
    if (!complete) continue;
    std::vector<std::pair<int64_t, int>> keyed;
    for (const auto& [b, s] : seen) {
      const int64_t when = s.ready_end != std::numeric_limits<int64_t>::min()
                               ? s.ready_end
                               : s.node_start;
      keyed.emplace_back(when, b);
    }
    std::sort(keyed.begin(), keyed.end());
    std::vector<int32_t> order;
    for (const auto& [when, b] : keyed) order.push_back(b);
    return order;
  }
  return {};
}

}  // namespace gradd
