// A copy of one job's state as the admin API shows it (server/admin/):
// taken on the JobManager's control thread (JobManager::Snapshot), then
// read anywhere without locks. Plain data; nothing in it points into the
// engine.
#ifndef GRADD_SERVER_ENGINE_JOB_JOB_SNAPSHOT_H_
#define GRADD_SERVER_ENGINE_JOB_JOB_SNAPSHOT_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/bucket_planner.h"
#include "server/engine/job/bucket_autotune.h"
#include "server/engine/reduce/bucket_reducer.h"

namespace gradd {

// A job's one explicit phase (job.h "Phase"): what its engine is doing now.
// Changed only by Job::EnterPhase; kFailed is final.
enum class JobPhase {
  kRunning,
  kSwitchingPlan,
  kDraining,
  kReforming,
  kFailed
};
// "running", "switching_plan", "draining", "reforming", "failed": the words
// of the phase events, the log and graddctl.
absl::string_view JobPhaseName(JobPhase phase);

// The client library's used map (client/src/data/used_map_client.h): a float32
// parameter registered first, one element per model parameter, averaged
// like a gradient, so element i > 0 exactly when some rank used parameter
// i + 1. Checked against the client's name in tests/unit/admin.
inline constexpr std::string_view kUsedMapParameterName =
    "[gradd] find_unused_parameters used map";

// Index of the used map in `params` (0), or -1 when the job has none (or
// one of another shape than the client's).
int FindUsedMapParam(const std::vector<ParamInfo>& params);

struct RankSnapshot {
  // kRestarting: its session closed without Detach and the job waits for
  // it to attach again (rank restart), until restart_deadline.
  enum class State { kAttaching, kLive, kDetached, kDisconnected, kRestarting };
  int local_rank = 0;
  int global_rank = -1;  // -1 until the job formed
  State state = State::kAttaching;
  // The session the rank attached through (0 once gone); never shown, the
  // admin source resolves it to the trainer's pid and uid.
  uint64_t session_id = 0;
  pid_t pid = 0;
  uid_t uid = 0;
  // kRestarting: when the grace ends, in Unix nanoseconds (the JobManager
  // fills it in).
  int64_t restart_deadline_unix_ns = 0;
};

struct BucketSnapshot {
  DType dtype = DType::kFloat32;
  size_t size_bytes = 0;
  size_t offset = 0;
  std::vector<int32_t> params;
  bool internal = false;
  uint64_t done_iteration = 0;
};

struct JobSnapshot {
  enum class State { kPending, kForming, kRunning, kFailed };
  std::string job_id;
  State state = State::kPending;
  int local_world_size = 0;
  int node_rank = 0;
  int num_nodes = 1;
  int world_size = 0;  // global
  // Every node's id by node rank, when the job formed across nodes.
  std::vector<std::string> node_ids;
  std::vector<RankSnapshot> ranks;  // by local rank

  // Filled only for a detailed snapshot (JobManager::Snapshot's `detail`):
  // parameters and plan can be large.
  std::vector<ParamInfo> params;
  PlannerOptions planner;
  std::vector<BucketSnapshot> buckets;  // empty until formed
  // The plan the job formed with, when a rebuild replaced it.
  std::vector<BucketSnapshot> initial_buckets;
  size_t rank_memory_bytes = 0;
  uint64_t broadcast_bytes = 0;

  // Summary figures (always filled once formed).
  size_t num_buckets = 0;
  uint64_t bucket_bytes = 0;
  uint64_t iteration = 0;  // smallest done sequence over the buckets
  ReducerStats stats;
  absl::Status status;  // the job's failure, or OK

  // Rank restart (common/control_block.h): the job's grace (0: none),
  // restarted ranks taken back and iterations their returns aborted.
  uint32_t rank_restart_grace_ms = 0;
  uint64_t restarts = 0;
  uint64_t iterations_aborted = 0;

  // Node loss and arrival (control_block.h "Re-formation"): num_nodes,
  // world_size, node_rank and node_ids above are the live ones; the job's
  // min_nodes (0: not elastic on it), the size it formed with (on a node
  // admitted into the running job: the node count it was admitted into,
  // but the job's initial world size, learned from the agreement),
  // re-formations so far, every node lost so far and the last
  // re-formation's reason.
  int min_nodes = 0;
  int initial_num_nodes = 1;
  int initial_world_size = 0;
  uint64_t epoch = 0;
  std::vector<std::string> lost_node_ids;
  std::string last_reformation_reason;
  JobPhase phase = JobPhase::kRunning;  // meaningful once formed

  // Bucket rebuild (engine/job/rebuild.h).
  bool rebuilt = false;
  uint64_t rebuild_iteration = 0;
  std::vector<int32_t> rebuild_ready_order;
  // Autotune of the bucket cap (bucket_autotune.h); unset: a fixed cap.
  std::optional<AutotuneSnapshot> autotune;

  // find_unused_parameters: the job carries the client's used map; the
  // parameters (indices into params) no rank used in `unused_iteration`
  // (0: no used map reduced yet); whether any iteration so far had one.
  bool has_used_map = false;
  uint64_t unused_iteration = 0;
  std::vector<int32_t> unused_params;
  bool ever_unused = false;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_JOB_SNAPSHOT_H_
