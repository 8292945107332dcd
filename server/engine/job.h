// One job on this node, once every local rank has attached: its shared
// memory (control block + one bucket memfd per rank) and its engine thread.
//
// Owns: the control-block and rank memfds (until handed out) and their
// mappings, the engine thread, the reducer.
// Threads: the engine thread (started by Start) runs the reduce loop and
// hands buckets and broadcasts to the reducer; the reducer's completion
// (engine thread for the fused path, the network thread for the
// hierarchical one) is the only writer of done_seq / bcast_done_seq, one
// completion per bucket or broadcast in flight; RankGone/Fail/Stop are
// called from the JobManager's thread. Errors reach trainers through the
// control block (status + message), never through return values.
//
// Rank lifecycle, per local rank:
//
//   attached --(Detach RPC)----------> detached     \  error published only if
//       \-----(session socket closes)-> disconnected /  another rank is waiting
//                                                       on work that needed it
#ifndef GRADD_SERVER_ENGINE_JOB_H_
#define GRADD_SERVER_ENGINE_JOB_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/bucket_planner.h"
#include "common/control_block.h"
#include "common/shm.h"
#include "gradd/v1/node.pb.h"
#include "server/engine/bucket_reducer.h"
#include "server/hooks/comm_hook_factory.h"

namespace gradd {

struct JobSpec {
  std::string job_id;
  int local_world_size = 1;
  std::vector<ParamInfo> params;
  BucketPlan plan;
  uint64_t broadcast_bytes = 0;
  // Engine doorbell spin before sleeping.
  std::chrono::microseconds spin{50};
  // Where this node's ranks sit in a multi-node job (defaults: one node,
  // global rank = local rank). world_size 0 means local_world_size.
  int node_rank = 0;
  int num_nodes = 1;
  int global_rank_offset = 0;
  int world_size = 0;

  // The job's communication hook as chosen at attach (validated; "":
  // allreduce), until a rank's SetCommHook; and the pool hooks split their
  // local work across (may be null).
  v1::CommHookSpec comm_hook;
  ThreadPool* hook_pool = nullptr;

  int global_world_size() const {
    return world_size > 0 ? world_size : local_world_size;
  }
};

class Job {
 public:
  // Allocates the control block and every rank's memory (sealed memfds) and
  // initialises the block. RESOURCE_EXHAUSTED / INTERNAL when memory cannot
  // be had. Does not start the engine.
  static absl::StatusOr<std::unique_ptr<Job>> Create(
      JobSpec spec, std::unique_ptr<BucketReducerInterface> reducer);
  ~Job();  // Stop()s

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // Starts the engine thread.
  void Start();
  // Stops and joins the engine thread (wakes it; bounded by one reduction).
  void Stop();

  const std::string& id() const { return spec_.job_id; }
  int local_world_size() const { return spec_.local_world_size; }
  const BucketPlan& plan() const { return spec_.plan; }
  size_t rank_memory_bytes() const { return rank_bytes_; }
  size_t broadcast_offset() const { return spec_.plan.total_bytes; }

  // The fds to send to local rank r: [control block, rank r's memory].
  std::vector<int> FdsFor(int rank) const;
  // Closes the daemon's copies of the memfds once every rank has its own.
  void ReleaseFds();
  // Attach reply (plan, sizes) for local rank r.
  v1::AttachResponse ResponseFor(int rank) const;

  // Local rank r is gone (detached == true: clean Detach; else its session
  // closed). The engine decides whether anyone is stuck. Any thread.
  void RankGone(int rank, bool detached);
  // Number of ranks that have not gone.
  int live_ranks() const;

  // Publishes a job failure now (e.g. daemon shutdown). Any thread.
  void Fail(absl::StatusCode code, absl::string_view message);

  // Local rank `rank` chooses the job's communication hook (Node.SetCommHook;
  // errors as CommHookSelection::Set). Any thread. The engine settles the
  // choice when the job's first bucket is about to start: ranks that
  // disagree, or nodes that do, fail the job with the reason.
  absl::Status SetCommHook(int rank, const v1::CommHookSpec& spec) {
    return hooks_.Set(rank, spec);
  }

  // The job's failure, or OK (reads the control block).
  absl::Status status() const;

  // For tests and stats: iteration last completed for bucket b.
  uint64_t done_seq(int bucket) const;
  // Cumulative per-phase times of the job's reducer. Any thread.
  ReducerStats reducer_stats() const { return reducer_->stats(); }

 private:
  enum RankState : int { kLive = 0, kDetached = 1, kDisconnected = 2 };

  Job(JobSpec spec, std::unique_ptr<BucketReducerInterface> reducer);
  void Loop();
  // One pass over buckets and broadcast; true if something was started.
  bool Scan();
  bool ScanBroadcast();
  void CheckStuck();
  // Engine thread: settles the hook and hands it to the reducer; false (job
  // failed) when ranks or nodes disagree or the hook cannot be built.
  bool ResolveCommHook();
  void Complete(int bucket, uint64_t iteration, absl::Status status);
  void FailJob(absl::StatusCode code, absl::string_view message);
  std::string RankName(int rank) const;

  const JobSpec spec_;
  const ControlLayout layout_;
  // Reset first in ~Job: its completions write into the mappings below.
  std::unique_ptr<BucketReducerInterface> reducer_;
  size_t rank_bytes_ = 0;

  UniqueFd control_fd_;
  Mapping control_;
  ControlHeader* header_ = nullptr;
  std::vector<UniqueFd> rank_fds_;
  std::vector<Mapping> rank_maps_;
  // bucket_buffers_[b][r]: bucket b inside rank r's mapping.
  std::vector<std::vector<void*>> bucket_buffers_;
  // bcast_areas_[r]: the broadcast area inside rank r's mapping.
  std::vector<void*> bcast_areas_;

  std::unique_ptr<std::atomic<int>[]> rank_state_;
  std::atomic<bool> stop_{false};
  std::thread thread_;

  // Engine thread only.
  std::vector<uint64_t> started_;  // iteration last handed to the reducer
  uint64_t bcast_started_ = 0;     // broadcast last handed to the reducer
  bool failed_ = false;
  bool hook_resolved_ = false;

  CommHookSelection hooks_;

  // Serialises failure publication between the engine and manager threads
  // (PublishError's first-failure-wins check is not atomic).
  absl::Mutex error_mu_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_H_
