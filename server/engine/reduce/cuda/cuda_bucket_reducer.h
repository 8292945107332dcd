// The reducer of jobs with CUDA buckets on real GPUs (device_reducer.h).
// CPU buckets (e.g. the client's used map) go to the host reducer it wraps;
// CUDA buckets are reduced on the GPUs, ordered by interprocess events:
//
//   trainer stream: ... backward kernels ... record ready[r][b] ─┐
//   trainer CPU:    ready_seq[b] = i, ring                       │
//   daemon engine:  sees every rank ready ─► each GPU's daemon stream waits
//                   on its ranks' ready[r][b] ─► reduce ─► record done[g][b]
//                   ─► done_seq[b] = i
//   trainer:        sees done_seq, its stream waits on done[g][b] (g: its
//                   GPU), then the optimizer's kernels read the gradients.
//
// The ranks are grouped by GPU. One GPU (every local rank shares it): the
// fused average kernel in place across the ranks' buckets, completed as
// soon as it is queued (no host sync anywhere). Several GPUs: per GPU the
// ranks' buckets are summed into a float32/float64 accumulator, NCCL
// allreduces the accumulators (one communicator per GPU, driven in group
// calls; NVLink inside the node), and the average is written back into
// every rank's bucket; a watchdog thread completes the bucket once every
// GPU's done event has fired, and fails it (aborting the communicators)
// when NCCL reports an error or the collective timeout passes, so a stuck
// collective never hangs the job.
//
// Several nodes, NCCL between them (DeviceJobSpec::nccl_between_nodes
// connected on every node at formation, formation/nccl_job_setup.h): the
// same collective path over the formation's communicators, which span
// every GPU of the job on every node (this node's GPUs are NCCL ranks
// first_rank.. in group order), divided by the global world size. The
// engine starts a bucket as soon as its local ranks are ready, which can
// differ between nodes, so the CUDA buckets go through a PlanOrderGate
// (plan_order_gate.h): each node issues its allreduces in (iteration, plan
// index) order. The communicators are non-blocking (created with a
// timeout): a group call that answers ncclInProgress is polled until
// enqueued, bounded by the collective timeout.
//
// Staged (host_staging.h): the buckets whose semantics only the host
// reducers implement go through pinned host memory and the wrapped host
// reducer, which writes the result back; the daemon streams wait on the
// ready events before the copies out and record the done events after the
// copies back, so the trainers' side of the handshake is unchanged:
//   - communication hooks (SetCommHook with a hook): every non-internal
//     CUDA bucket from then on (fp16/bf16 compression, PowerSGD run by
//     server/hooks/ exactly as on CPU);
//   - join epochs (BucketWork::ranks set): only the active ranks' buckets
//     are copied, waited on and written back, with the round's divisor;
//   - several nodes without NCCL between them: every CUDA bucket, through
//     the HierarchicalReducer (Gloo between the daemons), when the
//     formation's setup staged the job (a node without NCCL, a GPU two
//     daemons share -- NCCL needs a distinct GPU per rank across the job,
//     so the one-GPU test machine's two daemons always stage -- or NCCL
//     failing to connect on some node); the reason is logged. Hooks and
//     join epochs stay staged with NCCL between nodes too; the staged
//     buckets only move the plan-order gate's cursor.
// The staging thread is the reducer's own, so the engine thread never
// waits for a copy.
//
// An event is re-recorded only after every wait on its previous record was
// enqueued (the engine starts bucket b of i + 1 only after every rank
// published i + 1, which each does after its stream waited on done of i).
//
// Bucket rebuild (Replan, at an iteration boundary: every bucket of the
// old plan completed, nothing with the reducer): what is per bucket here
// is sized for any plan at Create, so the new plan's buckets reuse it --
// events by bucket slot (max(buckets, parameters) slots; the trainers
// opened every slot's handles at attach), accumulators of the largest
// bucket any plan can have. An event slot may change from an old bucket
// to a new one of another size: its previous record was waited for by
// every trainer's stream (WaitAll) before the rank asked to rebuild, so
// the rule above holds across the switch. What does change: the host
// staging's buffers (host_staging.h: drained, then re-made at the new
// sizes), the plan-order gate's sequence, and the wrapped host reducer's
// own per-bucket state (its Replan). The trainers move their gradients
// inside their device memory themselves (client/src/device/device_client.h),
// after their daemon's done events fired.
//
// Threads: Start / DescribeDevice on the engine thread (and JobManager's
// before Start); completions inline (one GPU), on the watchdog thread
// (several GPUs) or on the host reducer's completion thread (staged). Host
// reducer calls are serialised by host_mu_ (the engine thread's and the
// staging thread's). Errors name job, rank, device and bucket.
//
// None of this has run on a GPU yet in this form: the staging bookkeeping
// is unit-tested over a fake device
// (tests/unit/engine/reduce/host_staging_test), the plan-order gate and the
// NCCL setup's decisions over fakes (plan_order_gate_test, nccl_job_setup_test,
// nccl_job_platform_test), the CUDA calls only compiled (tests/gpu and
// tests/python GPU tests carry the checks for a machine with one). The NCCL
// path between nodes has never run on a GPU, nor on any machine: it needs two
// nodes with a GPU each.
#ifndef GRADD_SERVER_ENGINE_REDUCE_CUDA_CUDA_BUCKET_REDUCER_H_
#define GRADD_SERVER_ENGINE_REDUCE_CUDA_CUDA_BUCKET_REDUCER_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda/driver.h"
#include "common/cuda/owners.h"
#include "common/device_memory.h"
#include "server/backends/nccl/nccl_library.h"
#include "server/engine/formation/nccl_job_setup.h"
#include "server/engine/reduce/bucket_reducer.h"
#include "server/engine/reduce/device_reducer.h"
#include "server/engine/reduce/host_staging.h"
#include "server/engine/reduce/plan_order_gate.h"

namespace gradd {

class CudaBucketReducer final : public BucketReducerInterface,
                                private StagingDeviceInterface {
 public:
  static absl::StatusOr<std::unique_ptr<BucketReducerInterface>> Create(
      const DeviceJobSpec& spec, std::unique_ptr<BucketReducerInterface> host);
  ~CudaBucketReducer() override;

  void Start(const BucketWork& work, Completion done) override;
  void StartBroadcast(const BroadcastWork& work, Completion done) override;
  void StartJoinRound(JoinRoundWork work, RoundCompletion done) override;
  ReducerStats stats() const override;
  void Replan(uint64_t first_iteration, int num_buckets) override;
  // The host reducer's order starts there too. (Re-formation of a job
  // with CUDA buckets has not run on a GPU.)
  void StartAt(uint64_t first_iteration) override;
  // Passed to the host reducer (the staged buckets' network partitions).
  void SetPartitionBytes(uint64_t first_iteration, size_t bytes) override;
  [[nodiscard]] absl::Status SetCommHook(
      std::unique_ptr<CommHookInterface> hook) override;
  [[nodiscard]] absl::Status AgreeCommHook(
      const std::string& description) override;
  void DescribeDevice(int rank, v1::AttachResponse* response) const override;

 private:
  // The local ranks on one GPU.
  struct Group {
    int device = -1;  // the daemon's ordinal
    std::vector<int> ranks;
    cuda::CudaStream stream;
    std::vector<cuda::CudaEvent> done;  // by bucket slot
    std::vector<std::string> done_handles;
    // Staged: the copies to host of a bucket slot have landed.
    std::vector<cuda::CudaEvent> copied;
    // Several GPUs: the accumulator (largest bucket, accumulator type).
    std::unique_ptr<DeviceMemoryInterface> acc;
  };
  struct InFlight {
    int bucket = 0;
    std::chrono::steady_clock::time_point deadline;
    Completion done;
  };

  CudaBucketReducer(const DeviceJobSpec& spec, const cuda::CudaDriver* driver,
                    std::unique_ptr<BucketReducerInterface> host);
  std::string Where(int bucket) const;
  // NCCL between nodes: a bucket that goes another way only moves the
  // plan-order cursor.
  void PassGate(const BucketWork& work);
  // The bucket on the GPUs now: fused (one GPU, one node) or collective.
  void StartOnDevice(const BucketWork& work, Completion done);
  absl::Status StartFused(const BucketWork& work);
  absl::Status StartCollective(const BucketWork& work);
  void Watch();
  bool Staged(const BucketWork& work) const;
  // The groups the copies' ranks are on, in order of first appearance.
  std::vector<int> GroupsOf(absl::Span<const Copy> copies) const;
  // For each GPU the copies touch, with its context current: per_copy(g,
  // c, "<context> rank r device d") for its copies, then records
  // (g.*then_record)[bucket] on its daemon stream.
  absl::Status OnEachGroup(int bucket, absl::Span<const Copy> copies,
                           absl::string_view context,
                           absl::FunctionRef<absl::Status(
                               const Group&, const Copy&, const std::string&)>
                               per_copy,
                           std::vector<cuda::CudaEvent> Group::*then_record);
  // StagingDeviceInterface (host_staging.h), on the CUDA driver.
  absl::StatusOr<void*> AllocateHost(int rank, size_t bytes,
                                     absl::string_view context) override;
  void FreeHost(void* host) override;
  absl::Status CopyToHost(int bucket, absl::Span<const Copy> copies,
                          absl::string_view context) override;
  absl::Status WaitForHost(int bucket, absl::Span<const Copy> copies,
                           absl::Time deadline,
                           absl::string_view context) override;
  absl::Status CopyToDevice(int bucket, absl::Span<const Copy> copies,
                            absl::string_view context) override;
  absl::Status Drain(absl::Time deadline, absl::string_view context) override;
  // Polls `event` (its device's context current) until it has fired:
  // bounded by `deadline`, and no driver spinning on a core the trainers
  // need (as cuEventSynchronize would). Errors name `where` and `what`.
  absl::Status PollEvent(CUevent event, absl::Time deadline,
                         const std::string& where, absl::string_view what);

  const std::string job_id_;
  const int world_;
  const int node_rank_;
  const int num_nodes_;
  // What a bucket's sum is divided by unless the work says (the job's
  // global world size).
  const double divisor_;
  const std::chrono::milliseconds timeout_;
  const cuda::CudaDriver* const driver_;
  // Calls into host_ (engine and staging threads) hold host_mu_; stats()
  // reads it from any thread (its own atomics).
  absl::Mutex host_mu_;
  std::unique_ptr<BucketReducerInterface> host_;
  // Every CUDA bucket is staged (several nodes).
  bool stage_all_ = false;
  // A hook is installed (engine thread).
  bool hooked_ = false;
  std::unique_ptr<HostStaging> staging_;
  std::vector<Group> groups_;
  std::vector<int> rank_group_;  // local rank -> index into groups_
  // ready_[r][slot], made on rank r's GPU; handles exported once.
  std::vector<std::vector<cuda::CudaEvent>> ready_;
  std::vector<std::vector<std::string>> ready_handles_;
  // Several GPUs, or NCCL between nodes: the communicators (one per group,
  // by group index), this node's own (several local GPUs, one node) or the
  // formation's (between_nodes_ keeps them alive). Null: fused path.
  const nccl::NcclLibrary* nccl_ = nullptr;
  std::optional<nccl::NcclCommunicators> own_comms_;
  std::shared_ptr<NcclJobSetup> between_nodes_;
  nccl::NcclCommunicators* comms_ = nullptr;
  // NCCL between nodes: collectives in plan order on every node (engine
  // thread).
  std::optional<PlanOrderGate> gate_;
  absl::Mutex mu_;
  std::deque<InFlight> in_flight_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watchdog_;
  std::atomic<uint64_t> buckets_{0};
  std::atomic<uint64_t> enqueue_ns_{0};
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_REDUCE_CUDA_CUDA_BUCKET_REDUCER_H_
