// gradd client library: the trainer's side of the daemon.
//
// A Client is one local rank of one job attached to the node's gradd daemon.
// Its gradients live in bucket memory shared with the daemon: write (or
// accumulate) each parameter's gradient into gradient(i), call MarkReady(i);
// when the last parameter of a bucket is marked the daemon is told at once,
// so reduction overlaps the rest of backward. WaitAll() returns when every
// bucket of the iteration holds the average over all ranks of the job, and
// starts the next iteration.
//
//   auto client = gradd::Client::Attach(options, params);   // blocks until
//                                                           // all ranks attach
//   for (...) {
//     compute gradients into client->gradient(i), MarkReady(i) as each is done
//     if (absl::Status s = (*client)->WaitAll(); !s.ok()) return s;
//   }
//
// Bucket rebuild (DDP's Reducer::rebuild_buckets): the client records the
// order in which parameters are marked ready. Once, between two iterations
// (torch does it at the start of the second forward), every rank of the
// job calls RebuildBuckets(); the daemon re-plans the buckets from that
// order (local rank 0's, node rank 0's across nodes) and every gradient
// moves, with its current contents, to its new place: gradient(i) changes
// then, and the bucket list too.
//
// Thread safety: MarkReady and MarkUnused may be called from several threads
// at once (e.g. autograd threads); all other calls from one thread at a time.
// Errors are absl::Status with the daemon's message (job, rank, parameter);
// the library never aborts the process. After a job error every call
// returns that error.
#ifndef GRADD_CLIENT_INCLUDE_GRADD_CLIENT_H_
#define GRADD_CLIENT_INCLUDE_GRADD_CLIENT_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradd/collectives.h"

namespace gradd {

// Element types of ClientParam::dtype: the same values as the C ABI's
// GRADD_FLOAT32 ... (gradd.h) and the wire protocol's gradd.v1.DType.
namespace dtype {
inline constexpr int32_t kFloat32 = 1;
inline constexpr int32_t kFloat64 = 2;
inline constexpr int32_t kFloat16 = 3;
inline constexpr int32_t kBFloat16 = 4;
// Collectives only (not gradient parameters): exact integer arithmetic.
inline constexpr int32_t kInt32 = 5;
inline constexpr int32_t kInt64 = 6;
inline constexpr int32_t kUInt8 = 7;
inline constexpr int32_t kInt8 = 8;
}  // namespace dtype

struct ClientParam {
  std::string name;
  std::vector<int64_t> shape;
  int32_t dtype = dtype::kFloat32;  // one of gradd::dtype::k*
  // 0: the gradient lives in host memory; 1 (CUDA): on the rank's GPU
  // (ClientOptions::cuda_device), in device memory the daemon allocates.
  int32_t device = 0;
};

// The job's communication hook, run by the daemon between the local reduce
// and the network (proto/gradd/v1/comm_hook.proto). Every rank of a job
// must choose the same. name "": the daemon's default_comm_hook.
struct CommHookOptions {
  // "allreduce", "fp16_compress", "bf16_compress", "powerSGD",
  // "batched_powerSGD" (torch's function names).
  std::string name;
  // PowerSGD (torch's PowerSGDState); 0 / unset = torch's default. The
  // daemon draws the random initial Q matrices as torch's hook does with
  // PowerSGDState(random_seed=random_seed).
  int matrix_approximation_rank = 0;           // 1
  std::optional<int64_t> start_powersgd_iter;  // 1000
  double min_compression_rate = 0;             // 2
  std::optional<bool> use_error_feedback;      // true
  std::optional<bool> warm_start;              // true
  double orthogonalization_epsilon = 0;
  uint64_t random_seed = 0;
  bool batch_tensors_with_same_shape = false;
};

struct ClientOptions {
  // Daemon socket. Empty: $GRADD_SOCKET, else the daemon's default path.
  std::string socket_path;
  // A daemon uid to trust besides root and this process's own (unset:
  // $GRADD_DAEMON_UID if set). A socket served by anyone else is refused
  // with PERMISSION_DENIED before anything is sent to it.
  std::optional<uint32_t> daemon_uid;
  std::string job_id = "default";
  // -1 / 0: from the launcher's LOCAL_RANK / LOCAL_WORLD_SIZE, else 0 / 1.
  int local_rank = -1;
  int local_world_size = 0;
  // 0 = the daemon's defaults (25 MiB / 1 MiB).
  double bucket_cap_mb = 0;
  double first_bucket_cap_mb = 0;
  // Autotune: the daemon picks the bucket cap (bucket_cap_mb is ignored),
  // trying a few after the bucket rebuild; implies follow_plan_switches.
  bool bucket_cap_auto = false;
  // The trainer calls RebuildBuckets() again after every iteration that
  // next_plan_switch() names (every rank), so the daemon may tune the cap
  // of a job left to its default (`bucket_cap_mb: auto` in its config).
  bool follow_plan_switches = false;
  // Size of the broadcast area (bytes); 0 disables Broadcast() unless
  // collective_bytes gives the job an area (one area serves both).
  size_t broadcast_bytes = 0;
  // Size (bytes) of this rank's shared collective area, through which
  // Allreduce / Allgather / ReduceScatter / Barrier (and Broadcast of any
  // size) move their data in chunks. 0: kDefaultCollectiveBytes (4 MiB)
  // when the job registers no parameters (a collective-only job, e.g. a
  // torch.distributed process group), else none (the collectives then
  // return FAILED_PRECONDITION "attach with collective_bytes > 0"). Every
  // local rank of a job must choose the same size.
  size_t collective_bytes = 0;
  // How long to wait for the daemon's socket to accept.
  std::chrono::milliseconds connect_timeout{10000};
  // How long Attach waits for the other ranks.
  std::chrono::milliseconds attach_timeout{120000};
  // Upper bound on one WaitAll/Broadcast (the daemon reports failures much
  // sooner; this only guards against a wedged daemon).
  std::chrono::milliseconds wait_timeout{600000};
  // A daemon whose heartbeat (control block) is older than this while we
  // wait for it is taken for stopped or wedged: UNAVAILABLE "daemon not
  // responding". $GRADD_HEARTBEAT_TIMEOUT_MS overrides the default.
  std::chrono::milliseconds heartbeat_timeout{5000};
  // Multi-node. Empty / unset / 0: from the launcher's environment
  // (torchrun's GROUP_WORLD_SIZE, WORLD_SIZE / LOCAL_WORLD_SIZE, GROUP_RANK,
  // MASTER_ADDR; gradd's GRADD_NUM_NODES, GRADD_NODE_RANK, GRADD_NODE_ID,
  // GRADD_COORDINATOR; see client/src/session/launcher_env.h), else single
  // node. `coordinator` names the coordinator's host ("host" or "host:port");
  // the daemons add their rendezvous port (29600) and the daemon on that host
  // serves the rendezvous.
  std::string node_id;
  std::optional<int> node_rank;
  int num_nodes = 0;
  std::string coordinator;
  // The world the launcher started (0 / unset: $WORLD_SIZE / $RANK, else not
  // checked): Attach fails with FAILED_PRECONDITION naming both numbers when
  // the daemons formed another world size or placed this rank elsewhere.
  int world_size = 0;
  std::optional<int> rank;
  // torch DDP's find_unused_parameters: every rank tells the others which
  // parameters it used in each iteration (the "locally used map", reduced by
  // the daemon like a gradient). The client registers one hidden float32
  // parameter of num_params() elements first in registration order (so the
  // planner puts it in the last bucket, the last to be ready anyway); it is
  // never seen through this API (indices, num_params(), bucket(b).params).
  // Every rank of a job must set the same value (a mismatch is reported as
  // mismatched models). Enables MarkUnused, GloballyUsed and SkipUsedMap.
  bool find_unused_parameters = false;
  // Record the ready order so RebuildBuckets() can re-plan (false: it
  // does nothing and MarkReady skips the recording).
  bool rebuild_buckets = true;
  // The job's communication hook (default: the daemon's).
  CommHookOptions comm_hook;
  // The GPU (this process's CUDA ordinal) every CUDA parameter lives on;
  // required when any ClientParam::device is 1.
  int cuda_device = -1;
  // Rank restart (Client::restarted): how long the daemon keeps this job
  // waiting for a rank whose process died (0: the job fails at once).
  // Unset: $GRADD_RANK_RESTART_GRACE_MS if set, else the daemon's
  // rank_restart_grace_ms. Every local rank must choose the same.
  std::optional<uint32_t> rank_restart_grace_ms;
  // Node loss and arrival (common/control_block.h "Re-formation"): the
  // smallest number of nodes this multi-node job goes on with when a node
  // dies (0: it needs all of them; a lost node fails it). Unset:
  // $GRADD_MIN_NODES if set, else the daemon's min_nodes. At most
  // num_nodes; every rank of the job on every node must choose the same.
  // A job with min_nodes > 0 also gets the default collective area (for
  // the state sync) when neither broadcast_bytes nor collective_bytes asks
  // for one.
  std::optional<uint32_t> min_nodes;
  // After a node is lost or added, average buckets over the job's initial
  // world size (true) instead of the live one (false, the default), like
  // DDP's join(divide_by_initial_world_size=True).
  bool divide_by_initial_world_size = false;
};

// The payload URL marking the ABORTED status of an aborted iteration or
// collective round (IsIterationAborted), as opposed to a failed job.
inline constexpr char kIterationAbortedPayload[] = "gradd.iteration_aborted";
// True when `status` says the iteration (or collective round) was aborted
// because a rank of the job restarted: skip the optimizer step and retry
// the batch, after the state sync (Client::StateSyncPending). The job goes
// on; every other ABORTED is the job's failure.
bool IsIterationAborted(const absl::Status& status);

// What MarkUnused contributes for a parameter this rank did not use.
enum class UnusedGradient {
  kZero,  // zeroes the gradient memory first: contributes nothing
  kKeep,  // contributes what the memory holds (torch contributes a locally
          // unused parameter's existing .grad)
};

// Uneven inputs (DDP's join()): see Client::JoinEnter.
struct JoinOptions {
  // Divide by the job's world size (true) or by the number of ranks still
  // active in the iteration (false).
  bool divide_by_initial_world_size = true;
  // Fail every rank (ABORTED) as soon as one rank runs out of inputs.
  bool throw_on_early_termination = false;
};

struct JoinResult {
  // The global rank whose model every rank should copy (DDP: the highest
  // rank among the last to run out of inputs).
  int authoritative_rank = -1;
  // The job's next iteration (iteration() after Join returned).
  uint64_t next_iteration = 0;
};

struct BucketInfo {
  int32_t dtype;
  size_t size_bytes;
  std::vector<int32_t> params;
  // 1: the bucket is on the rank's GPU (ClientParam::device).
  int32_t device = 0;
};

class Client {
 public:
  virtual ~Client() = default;

  // Connects, registers `params` and maps the shared memory. Blocks until
  // every local rank of the job has attached (bounded by attach_timeout).
  static absl::StatusOr<std::unique_ptr<Client>> Attach(
      const ClientOptions& options, const std::vector<ClientParam>& params);

  // Parameter i's gradient in shared bucket memory (bytes = numel * dtype
  // size). Stable for the life of the Client, except across
  // RebuildBuckets().
  virtual void* gradient(int param) const = 0;
  virtual size_t gradient_bytes(int param) const = 0;
  virtual int num_params() const = 0;

  // Marks parameter `param`'s gradient final for this iteration. Errors:
  // OUT_OF_RANGE for an unknown index, FAILED_PRECONDITION when it was
  // already marked in this iteration (names the parameter).
  // With find_unused_parameters, also records `param` as used by this rank.
  virtual absl::Status MarkReady(int param) = 0;
  // CUDA parameters: MarkReady, ordered after the work queued so far on
  // `cuda_stream` (a CUstream / cudaStream_t; null: the legacy default
  // stream) that wrote the gradient. When it completes a bucket the stream
  // records the bucket's ready event before the daemon is told; the CPU
  // never waits for the GPU. For host parameters the stream is ignored.
  virtual absl::Status MarkReadyOn(int param, void* cuda_stream);

  // find_unused_parameters only (else FAILED_PRECONDITION): marks `param`
  // ready without recording it as used by this rank. Same errors as
  // MarkReady.
  virtual absl::Status MarkUnused(
      int param, UnusedGradient gradient = UnusedGradient::kZero);
  // After WaitAll: whether some rank marked `param` with MarkReady in the
  // iteration just waited for. Always true without find_unused_parameters;
  // false for an unknown index or before the first WaitAll.
  virtual bool GloballyUsed(int param) const;
  // find_unused_parameters only: declares that this iteration needs no used
  // map (e.g. a static graph after its first iteration, or no parameter can
  // be unused): the map's slot is handed over now, counting every parameter
  // as used, so that its bucket is not held back until WaitAll. Must not run
  // concurrently with MarkReady/MarkUnused. Without find_unused_parameters:
  // a no-op.
  virtual absl::Status SkipUsedMap();

  // Blocks until every bucket of the current iteration is averaged, then
  // starts the next iteration. FAILED_PRECONDITION (naming the parameters)
  // if some parameters were never marked ready (with find_unused_parameters:
  // neither by MarkReady nor by MarkUnused).
  virtual absl::Status WaitAll() = 0;
  // WaitAll, and then makes `cuda_stream` wait (on the GPU, without a host
  // sync) for the daemon's reduction of every CUDA bucket, so work queued
  // on it afterwards (the optimizer) reads the averaged gradients.
  virtual absl::Status WaitAllOn(void* cuda_stream);
  // 1 when parameter `param`'s gradient is device memory (gradient() is
  // then a device address in this process), 0 for host memory.
  virtual int gradient_device(int param) const { return 0; }
  // Non-blocking: whether bucket b of the current iteration is done.
  virtual bool BucketDone(int bucket) const = 0;
  // Blocks until bucket `bucket` of the current iteration is averaged (its
  // parameters' gradients may be read), without ending the iteration: the
  // iteration ends with WaitAll, which is cheap once every bucket has been
  // waited for. Lets a trainer use the first buckets' results (e.g. step
  // their parameters and start the next forward on them) while later ones
  // are still on the wire. Every parameter of the bucket must have been
  // marked this iteration (else FAILED_PRECONDITION naming the bucket);
  // OUT_OF_RANGE for an unknown bucket. Otherwise the same errors as
  // WaitAll: the job's failure, a daemon gone or stopped, wait_timeout, and
  // an iteration aborted by a rank restart (IsIterationAborted; the
  // iteration is then over, as after WaitAll). Waiting again for a bucket
  // already done returns at once.
  virtual absl::Status WaitBucket(int bucket) {
    return WaitBucketOn(bucket, nullptr);
  }
  // WaitBucket, and then makes `cuda_stream` wait (on the GPU) for the
  // daemon's reduction of the bucket when it is a CUDA bucket.
  virtual absl::Status WaitBucketOn(int bucket, void* cuda_stream);

  // Daemon-mediated broadcast of `bytes` bytes from global rank `root` to
  // every rank of the job (in place in `data`). Independent of gradient
  // iterations; every rank must make the same sequence of Broadcast calls
  // with the same size. Data larger than the area (the larger of
  // broadcast_bytes and collective_bytes) goes in several rounds.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;

  // Uneven inputs, as DDP's join(): every rank calls JoinEnter before the
  // same iteration with the same options; then each iteration a rank either
  // takes part (MarkReady...WaitAll, optionally JoinActive first) or, when
  // it has run out of inputs, calls Join(): from then on the daemon
  // contributes zeros for it (no collectives run in this process) and
  // averages over the initial world size or the ranks still active. Join()
  // blocks until every rank of the job joined and returns the rank whose
  // model is authoritative (copy it with Broadcast, as DDP's final model
  // sync does); join mode ends with it. While in join mode Broadcast is
  // only available through JoinActive's sync.
  // FAILED_PRECONDITION when already in join mode.
  virtual absl::Status JoinEnter(const JoinOptions& options) = 0;
  virtual bool in_join() const = 0;
  // This rank takes part in the current iteration (MarkReady says so too;
  // call this before computing to get the following). With
  // throw_on_early_termination: blocks until every rank is decided for the
  // iteration and returns ABORTED naming the rank if one ran out of inputs
  // (join mode then ends on every rank). With sync_bytes > 0: replaces
  // sync_data with the highest active rank's bytes (DDP broadcasts buffers
  // from it in join mode); every active rank must pass the same size
  // (<= broadcast_bytes), once per iteration.
  virtual absl::Status JoinActive(void* sync_data, size_t sync_bytes) = 0;
  // This rank has no more inputs (call between iterations). ABORTED
  // ("Rank r exhausted all inputs") with throw_on_early_termination.
  virtual absl::StatusOr<JoinResult> Join() = 0;
  // Chooses the job's communication hook after Attach; every local rank
  // must call it with the same hook before its first MarkReady. Errors:
  // INVALID_ARGUMENT (unknown hook, listing the supported ones; another
  // rank chose differently, naming both), FAILED_PRECONDITION (called
  // twice, or after the job's first bucket started).
  virtual absl::Status SetCommHook(const CommHookOptions& hook) = 0;

  // Clean goodbye (also done by the destructor).
  virtual absl::Status Detach() = 0;

  // Re-plans the buckets from the ready order of the last completed
  // iteration, as DDP does once after its first iteration. Call between
  // WaitAll() and the next MarkReady(); every local rank of every node must
  // call it at the same point (a rank that does not fails the job within
  // the daemon's timeout). Blocks until every rank has asked. Returns
  // false without asking the daemon when there is nothing to do: buckets
  // rebuilt already, rebuild disabled (ClientOptions::rebuild_buckets), or
  // no iteration completed yet. Afterwards gradient(i) points at the new
  // place, which holds the gradient's previous contents. CUDA buckets are
  // rebuilt too: their gradients move inside the rank's device memory
  // once the GPU has finished the daemon's last reduce and all of this
  // process's queued work on the device (it synchronises the context: the
  // one host sync of a CUDA job). Errors:
  // FAILED_PRECONDITION when called inside an iteration; the daemon's
  // (rebuild.h), which also fail the job.
  virtual absl::StatusOr<bool> RebuildBuckets() = 0;
  // Whether RebuildBuckets() re-planned the buckets (torch's
  // has_rebuilt_buckets).
  virtual bool buckets_rebuilt() const = 0;
  // Autotune (ClientOptions::bucket_cap_auto): the iteration after which
  // the daemon switches the plan again; every rank calls RebuildBuckets()
  // between it and the next MarkReady (it then re-plans again). 0: none.
  virtual uint64_t next_plan_switch() const { return 0; }
  // Parameter indices in the order they were marked ready in the last
  // recorded iteration (empty before the first one completed). Recorded:
  // the first two iterations (DDP rebuilds from the first, or the second
  // with static_graph), none once buckets are rebuilt or when disabled.
  virtual std::vector<int32_t> ready_order() const = 0;

  virtual int num_buckets() const = 0;
  virtual const BucketInfo& bucket(int b) const = 0;
  // Iteration number of the current (not yet waited) iteration, from 1.
  virtual uint64_t iteration() const = 0;
  virtual int global_rank() const = 0;
  virtual int world_size() const = 0;
  virtual int local_rank() const = 0;
  virtual int local_world_size() const = 0;

  // Collectives of arbitrary tensors (collectives.h; declared last so that
  // the vtable slots of the calls above keep their places), blocking, one at a
  // time per Client (the caller serialises them). Ranks are global ranks;
  // every rank must issue the same sequence. `dtype` is one of
  // gradd::dtype::k*. Errors: FAILED_PRECONDITION without a collective
  // area; INVALID_ARGUMENT for a bad dtype/op (kAvg of integers) or when
  // the ranks disagree (which fails the job); the job's error.
  //
  // In place: data[i] = op over every rank's data[i] (count elements).
  virtual absl::Status Allreduce(void* data, size_t count, int32_t dtype,
                                 ReduceOp op);
  // output (world_size() * bytes) = every rank's `bytes` of input, in rank
  // order.
  virtual absl::Status Allgather(const void* input, size_t bytes, void* output);
  // input: world_size() * count elements; output: this rank's block (block
  // global_rank()) of the element-wise reduction, count elements.
  virtual absl::Status ReduceScatter(const void* input, void* output,
                                     size_t count, int32_t dtype, ReduceOp op);
  // Returns once every rank of the job has entered the barrier.
  virtual absl::Status Barrier();

  // Rank restart (common/control_block.h "Rank restart"; the job's
  // rank_restart_grace_ms > 0). When a rank of the job dies and comes back
  // within the grace, the iteration it died in (and any begun while it was
  // away) is aborted: WaitAll (or a collective) returns ABORTED with
  // IsIterationAborted true, the buckets hold no average, and the next
  // iteration starts. Before its next iteration every rank then runs the
  // state sync:
  //
  //   if (client->StateSyncPending()) {
  //     ASSIGN_OR_RETURN(int root, client->BeginStateSync());
  //     client->Broadcast(model_state, bytes, root);   // and any other state
  //   }
  //
  // True when this Attach re-attached a restarted rank to its running job
  // (its first iteration is then iteration(), past 1).
  virtual bool restarted() const { return false; }
  // The name restarted() had until this release (server/engine/README.md,
  // "Glossary": "join" is only uneven inputs); removed in the next one.
  [[deprecated("use restarted(); rejoined() goes in the next release")]] bool
  rejoined() const {
    return restarted();
  }
  // The grace the job runs with (0: none).
  virtual uint32_t rank_restart_grace_ms() const { return 0; }
  // A state sync is due: a rank restarted since this rank last synced, or
  // this rank restarted and has not synced yet. Every rank of the job sees
  // the same at the same point of its iteration sequence (the daemon aborts
  // what was in flight when the rank came back).
  virtual bool StateSyncPending() const { return false; }
  // The sync's root: the lowest global rank that holds the job's state
  // (an allreduce MIN over the ranks, a restarted rank not yet synced
  // offering none), and marks the sync handled; the caller broadcasts its
  // state from it. FAILED_PRECONDITION when no rank holds the state (every
  // rank restarted before a sync); ABORTED (IsIterationAborted) when
  // another restart aborted the allreduce (call it again).
  virtual absl::StatusOr<int> BeginStateSync();
  // Iterations aborted by rank restarts since this rank attached, and
  // restarted ranks re-attached to the job so far (the daemon's count).
  virtual uint64_t iterations_aborted() const { return 0; }
  virtual uint64_t restarts() const { return 0; }

  // Node loss and arrival (common/control_block.h "Re-formation";
  // ClientOptions::min_nodes). When a node of the job dies (or comes back,
  // or one of its ranks restarts), the job's daemons re-form their network
  // at an iteration boundary: the iteration in progress is aborted on every
  // rank exactly as for a rank restart (IsIterationAborted, then the state
  // sync), global ranks stay what they were, and the live world size
  // changes. The job's min_nodes (0: not elastic), as the daemon answered.
  virtual uint32_t min_nodes() const { return 0; }
  // Global ranks taking part now (read from the job's control block; the
  // job's world_size() until a node is lost or added).
  virtual int live_world_size() const { return world_size(); }
  // Re-formations of the job's inter-node group so far (0: none).
  virtual uint64_t epoch() const { return 0; }
  // The last re-formation found this rank's node one iteration behind the
  // others (header.state_behind) and the rank has not synced since: it
  // offers no state in the next state sync and must load what the root
  // broadcasts (like a restarted rank).
  virtual bool state_behind() const { return false; }
};

}  // namespace gradd

#endif  // GRADD_CLIENT_INCLUDE_GRADD_CLIENT_H_
