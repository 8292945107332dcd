// The engine's event stream: what jobs do, reported once to every observer
// (Prometheus metrics in server/metrics/, the per-job timeline ring in
// engine/observe/timeline.h, the stall reports of
// engine/observe/stall_inspector.h and whatever the admin API reads from them).
//
// Two levels, so the hot path never looks a job up:
//   EngineEventSinkInterface  daemon-wide (attach outcomes, detaches); when a
//                             job becomes active it hands out that job's
//                             JobEventSinkInterface, which the Job owns and
//                             destroys when the job ends.
//   JobEventSinkInterface     one job's buckets, iterations, stalls and
//                             failure.
//
// Threads and cost: OnBucket/OnIteration run on the thread that completes a
// job's buckets (the engine thread for single-node jobs, the reducer's
// network thread for multi-node ones), right before the bucket's done_seq
// is published (so the engine may reuse the bucket's bookkeeping as soon as
// it sees done). Sinks are thus on the data path and must not block:
// atomic counters, histograms and a preallocated ring under a short lock
// are fine; I/O, allocation and locks held elsewhere for long are not. OnStall
// runs on the engine thread; OnFailed on any thread, once per job;
// OnRankRestarting on the job manager's thread, OnRankRestarted and OnPhase
// on the engine thread (all rare).
// EngineEventSinkInterface calls come from the job manager's control thread,
// OnAttach from whichever thread answers the Attach.
#ifndef GRADD_SERVER_ENGINE_OBSERVE_JOB_EVENTS_H_
#define GRADD_SERVER_ENGINE_OBSERVE_JOB_EVENTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace gradd {

// One entry of a job's timeline (engine/observe/timeline.h): a bucket phase of
// one iteration, on one local rank (phase "ready": from the moment the engine
// saw the rank hand the bucket over until the bucket started) or on the
// node (local_rank -1: "local_reduce", "network", "write_back", and "done",
// the instant the result was published).
struct TimelineEvent {
  uint64_t iteration = 0;
  int bucket = 0;
  int local_rank = -1;  // -1: the node's own phases
  std::string phase;    // "ready", "local_reduce", "network", "write_back",
                        // "done"
  int64_t start_unix_ns = 0;
  int64_t duration_ns = 0;
};

// A bucket that has waited longer than stall_warning_ms
// (engine/observe/stall_inspector.h): who has not handed it over.
struct StallReport {
  std::string job_id;
  uint64_t iteration = 0;
  int bucket = 0;
  double waited_seconds = 0;
  // Local ranks that have not made the bucket ready.
  std::vector<int> missing_local_ranks;
  // Multi-node, bucket in the inter-node allreduce: the other nodes of the
  // job (the daemon cannot tell which of them has not sent yet).
  std::vector<std::string> missing_nodes;
  // The bucket's parameters (the daemon sees a bucket's readiness, not each
  // parameter's: these are the candidates, not a verdict).
  std::vector<std::string> unready_parameters;
  // One line for logs and errors, naming all of the above.
  std::string message;
};

// The engine's clock (steady, nanoseconds) and its Unix time equivalent
// (the offset between the two clocks is measured once per process).
int64_t EngineNowNs();
int64_t EngineToUnixNs(int64_t engine_ns);

// A phase of one bucket: when it first ran and for how long in total (a
// chunked bucket runs a phase several times). start_ns 0: it did not run.
struct PhaseSpan {
  int64_t start_ns = 0;
  int64_t duration_ns = 0;
  void Add(int64_t start, int64_t ns) {
    if (start_ns == 0) start_ns = start;
    duration_ns += ns;
  }
};

// Filled by a reducer (BucketWork::timing) for the bucket it reduces. The
// fused single-node pass counts as local reduce; a multi-node bucket whose
// local sum and write-back the backend folds into its ring counts as
// network.
struct BucketTiming {
  PhaseSpan local_reduce;
  PhaseSpan network;
  PhaseSpan write_back;
  // Multi-node priority scheduling (hierarchical_reducer.h): negotiations
  // among the nodes that led to this bucket's chunks going out, and whether
  // it went to the network before a bucket earlier in plan order.
  int negotiations = 0;
  bool out_of_order = false;
};

// One bucket of one iteration, reduced. Engine clock throughout.
struct BucketEvent {
  uint64_t iteration = 0;
  int bucket = 0;
  int num_buckets = 0;  // buckets in the job's plan for this iteration
  uint64_t bytes = 0;   // payload of the bucket (per rank)
  // When the engine saw the first local rank hand the bucket over (0: not
  // known, e.g. in a join iteration); when it handed the bucket to the
  // reducer; when the result was published.
  int64_t first_ready_ns = 0;
  int64_t start_ns = 0;
  int64_t done_ns = 0;
  BucketTiming phases;
  // By local rank: when the engine saw it hand the bucket over (0: unknown).
  absl::Span<const int64_t> rank_ready_ns;
};

// One iteration whose every bucket has been reduced.
struct IterationEvent {
  uint64_t iteration = 0;
  // Since the previous iteration ended (0 for the first one this job saw).
  int64_t step_ns = 0;
  // Time some bucket was with the reducer (union of the buckets' spans from
  // start to done), and the part of it before the last bucket was handed
  // over, i.e. while the trainers were still in backward.
  int64_t communication_ns = 0;
  int64_t overlapped_ns = 0;
};

// A local rank's restart (common/control_block.h, "Rank restart"). Engine
// clock.
struct RankRestartEvent {
  int local_rank = 0;
  // Restarting: when its session closed (since_ns == at_ns). Rejoined: when
  // it went away (since_ns) and when the engine took it back (at_ns).
  int64_t since_ns = 0;
  int64_t at_ns = 0;
  // Rejoined: the gradient iteration and collective round its return
  // aborted (0: none).
  uint64_t aborted_iteration = 0;
  uint64_t aborted_round = 0;
  // The job's ranks taking part after the event: its world size less the
  // local ranks away now.
  int world_size = 0;
  // Restarting: why the daemon waits ("session closed without Detach").
  std::string reason;
  // Rejoined: its return was one re-formation of a multi-node job's group
  // (OnNetworkReformed reports that event and its aborted iteration; this
  // one is the rank's part of it, not a second abort).
  bool with_reformation = false;
};

// What a re-formation of a multi-node job's group was: the same on every
// node of the new epoch, as its closer decided it (formation/
// reformation.h, "members"). A node lost wins over a node admitted, which
// wins over a rank restart. kUnknown: a closer that did not say (older).
enum class ReformCause {
  kUnknown,
  kNodeLost,
  kNodeAdmitted,
  kRankRestarted,
  kOther
};
// "node_lost", "node_admitted", "rank_rejoined", "other" ("unknown" for
// kUnknown): the reason label of gradd_job_reformations_total.
absl::string_view ReformCauseName(ReformCause cause);

// A re-formation of a multi-node job's inter-node group (control_block.h,
// "Re-formation"). Engine clock.
struct NetworkReformEvent {
  // Broken: the epoch being left; reformed: the new one.
  uint64_t epoch = 0;
  // Broken: what this node saw (the network error, "local rank 1
  // rejoined", "node asks to be admitted"). Reformed: what the re-formation
  // was, the closer's line, the same on every node ("local rank 1 of node
  // 'b' restarted", "node 'c' lost: ...").
  std::string reason;
  // Reformed: the kind of `reason`.
  ReformCause cause = ReformCause::kUnknown;
  // When the engine saw the break (broke_ns) and resumed on the new group
  // (at_ns; == broke_ns for the broken event).
  int64_t broke_ns = 0;
  int64_t at_ns = 0;
  // Reformed: the membership change, the new size, what was aborted.
  std::vector<std::string> lost;
  std::vector<std::string> admitted;
  // Reformed: the live nodes, by new node rank, and every node lost and
  // not back (the same on every node).
  std::vector<std::string> node_ids;
  std::vector<std::string> lost_node_ids;
  int num_nodes = 0;
  int world_size = 0;
  uint64_t aborted_iteration = 0;
  uint64_t aborted_round = 0;
};

// A change of the job's phase (engine/job/job.h "Phase": running,
// switching_plan, draining, reforming, failed). Engine clock.
struct JobPhaseEvent {
  std::string from;
  std::string to;
  // What moved it: the break's reason, the plan switch's iteration, the
  // failure's message.
  std::string why;
  uint64_t epoch = 0;  // the job's epoch when it changed
  int64_t at_ns = 0;
};

// Autotune of the bucket cap (job/bucket_autotune.h): the plan switch
// after `iteration` to the next trial's cap, or to the one it settled on.
struct AutotuneEvent {
  uint64_t iteration = 0;
  uint64_t bucket_cap_bytes = 0;
  int trial = 0;  // 1-based while tuning; 0 once settled
  int trials = 0;
  bool settled = false;
};

class JobEventSinkInterface {
 public:
  virtual ~JobEventSinkInterface() = default;
  virtual void OnBucket(const BucketEvent& event) {}
  virtual void OnIteration(const IterationEvent& event) {}
  virtual void OnStall(const StallReport& report) {}
  // The job failed (the first failure only; not the end of a job whose
  // ranks all left).
  virtual void OnFailed(absl::StatusCode code, absl::string_view message) {}
  // Rank restart: a local rank went away and the job waits for it (any
  // thread); it came back (the engine thread, once its return aborted what
  // it had to).
  virtual void OnRankRestarting(const RankRestartEvent& event) {}
  virtual void OnRankRestarted(const RankRestartEvent& event) {}
  // Node loss and arrival: the job's inter-node group broke (the engine
  // thread, once drained) and was re-formed (the engine thread, after the
  // abort). A re-formation that fails ends in OnFailed.
  virtual void OnNetworkBroken(const NetworkReformEvent& event) {}
  virtual void OnNetworkReformed(const NetworkReformEvent& event) {}
  // The job's phase changed (the engine thread; rare).
  virtual void OnPhase(const JobPhaseEvent& event) {}
  // Autotune switched the bucket cap (the rebuild coordinator's thread;
  // a few times per job).
  virtual void OnAutotune(const AutotuneEvent& event) {}
};

// What the job manager knows of a job when it becomes active.
struct JobInfo {
  std::string job_id;
  int local_world_size = 0;
  int node_rank = 0;
  int num_nodes = 1;
  // Shared memory the daemon holds for the job (every rank's memory and the
  // control blocks).
  uint64_t shared_memory_bytes = 0;
  // Ranks of the job on every node (its global world size).
  int world_size = 0;
  // The job's nodes when it starts (node ids by node rank; empty for a
  // single-node job), and those lost before (a node admitted into its
  // running job learns them from the agreement).
  std::vector<std::string> node_ids;
  std::vector<std::string> lost_node_ids;
  // The network epoch it starts at: 0 for a job that formed, the running
  // job's epoch for a node admitted into it.
  uint64_t epoch = 0;
  // The bucket cap it starts with, and whether autotune may change it.
  uint64_t bucket_cap_bytes = 0;
  bool autotune = false;
};

class EngineEventSinkInterface {
 public:
  virtual ~EngineEventSinkInterface() = default;
  // An Attach was answered with `code`.
  virtual void OnAttach(absl::StatusCode code) {}
  // A local rank of an active job went away: clean (Detach) or its session
  // closed.
  virtual void OnDetach(bool clean) {}
  // A job became active; the returned sink (may be null) gets the job's
  // events and is destroyed when the job ends.
  virtual std::unique_ptr<JobEventSinkInterface> OnJobStarted(
      const JobInfo& job) {
    return nullptr;
  }
};

// Forwards every event to each of its sinks, in order. Owns the sinks it was
// given as unique_ptrs; the raw ones must outlive it.
class JobEventFanOut final : public JobEventSinkInterface {
 public:
  void Add(JobEventSinkInterface* sink) {
    if (sink != nullptr) sinks_.push_back(sink);
  }
  void Add(std::unique_ptr<JobEventSinkInterface> sink) {
    Add(sink.get());
    if (sink != nullptr) owned_.push_back(std::move(sink));
  }
  void OnBucket(const BucketEvent& event) override {
    for (JobEventSinkInterface* s : sinks_) s->OnBucket(event);
  }
  void OnIteration(const IterationEvent& event) override {
    for (JobEventSinkInterface* s : sinks_) s->OnIteration(event);
  }
  void OnStall(const StallReport& report) override {
    for (JobEventSinkInterface* s : sinks_) s->OnStall(report);
  }
  void OnFailed(absl::StatusCode code, absl::string_view message) override {
    for (JobEventSinkInterface* s : sinks_) s->OnFailed(code, message);
  }
  void OnRankRestarting(const RankRestartEvent& event) override {
    for (JobEventSinkInterface* s : sinks_) s->OnRankRestarting(event);
  }
  void OnRankRestarted(const RankRestartEvent& event) override {
    for (JobEventSinkInterface* s : sinks_) s->OnRankRestarted(event);
  }
  void OnNetworkBroken(const NetworkReformEvent& event) override {
    for (JobEventSinkInterface* s : sinks_) s->OnNetworkBroken(event);
  }
  void OnNetworkReformed(const NetworkReformEvent& event) override {
    for (JobEventSinkInterface* s : sinks_) s->OnNetworkReformed(event);
  }
  void OnPhase(const JobPhaseEvent& event) override {
    for (JobEventSinkInterface* s : sinks_) s->OnPhase(event);
  }
  void OnAutotune(const AutotuneEvent& event) override {
    for (JobEventSinkInterface* s : sinks_) s->OnAutotune(event);
  }

 private:
  std::vector<JobEventSinkInterface*> sinks_;
  std::vector<std::unique_ptr<JobEventSinkInterface>> owned_;
};

// The daemon-wide fan-out: the per-job sinks of all its sinks, fanned out.
class EngineEventFanOut final : public EngineEventSinkInterface {
 public:
  // `sink` must outlive this object.
  void Add(EngineEventSinkInterface* sink) {
    if (sink != nullptr) sinks_.push_back(sink);
  }
  void OnAttach(absl::StatusCode code) override {
    for (EngineEventSinkInterface* s : sinks_) s->OnAttach(code);
  }
  void OnDetach(bool clean) override {
    for (EngineEventSinkInterface* s : sinks_) s->OnDetach(clean);
  }
  std::unique_ptr<JobEventSinkInterface> OnJobStarted(
      const JobInfo& job) override;

 private:
  std::vector<EngineEventSinkInterface*> sinks_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_OBSERVE_JOB_EVENTS_H_
