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
//     RETURN_IF_ERROR(client->WaitAll());
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
// Thread safety: MarkReady may be called from several threads at once (e.g.
// autograd threads); all other calls from one thread at a time.
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

namespace gradd {

enum class DType : int32_t;  // common/dtype.h; values as gradd.v1.DType

struct ClientParam {
  std::string name;
  std::vector<int64_t> shape;
  int32_t
      dtype;  // gradd::DType value: 1 float32, 2 float64, 3 float16, 4 bfloat16
};

struct ClientOptions {
  // Daemon socket. Empty: $GRADD_SOCKET, else the daemon's default path.
  std::string socket_path;
  std::string job_id = "default";
  int local_rank = 0;
  int local_world_size = 1;
  // 0 = the daemon's defaults (25 MiB / 1 MiB).
  double bucket_cap_mb = 0;
  double first_bucket_cap_mb = 0;
  // Size of the broadcast area (bytes); 0 disables Broadcast().
  size_t broadcast_bytes = 0;
  // How long to wait for the daemon's socket to accept.
  std::chrono::milliseconds connect_timeout{10000};
  // How long Attach waits for the other ranks.
  std::chrono::milliseconds attach_timeout{120000};
  // Upper bound on one WaitAll/Broadcast (the daemon reports failures much
  // sooner; this only guards against a wedged daemon).
  std::chrono::milliseconds wait_timeout{600000};
  // Multi-node (empty / unset: single node, or taken from the environment).
  std::string node_id;
  std::optional<int> node_rank;
  int num_nodes = 0;
  std::string coordinator;
  // Record the ready order so RebuildBuckets() can re-plan (false: it
  // does nothing and MarkReady skips the recording).
  bool rebuild_buckets = true;
};

struct BucketInfo {
  int32_t dtype;
  size_t size_bytes;
  std::vector<int32_t> params;
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
  virtual absl::Status MarkReady(int param) = 0;

  // Blocks until every bucket of the current iteration is averaged, then
  // starts the next iteration. FAILED_PRECONDITION (naming the parameters)
  // if some parameters were never marked ready.
  virtual absl::Status WaitAll() = 0;
  // Non-blocking: whether bucket b of the current iteration is done.
  virtual bool BucketDone(int bucket) const = 0;

  // Daemon-mediated broadcast of `bytes` bytes from global rank `root` to
  // every rank of the job (in place in `data`). Independent of gradient
  // iterations; every rank must make the same sequence of Broadcast calls.
  // bytes must not exceed ClientOptions::broadcast_bytes (larger data is
  // sent in several rounds by the caller).
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;

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
  // place, which holds the gradient's previous contents. Errors:
  // FAILED_PRECONDITION when called inside an iteration; the daemon's
  // (rebuild.h), which also fail the job.
  virtual absl::StatusOr<bool> RebuildBuckets() = 0;
  // Whether RebuildBuckets() re-planned the buckets (torch's
  // has_rebuilt_buckets).
  virtual bool buckets_rebuilt() const = 0;
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
};

}  // namespace gradd

#endif  // GRADD_CLIENT_INCLUDE_GRADD_CLIENT_H_
