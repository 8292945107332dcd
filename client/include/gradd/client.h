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
  // The job's communication hook (default: the daemon's).
  CommHookOptions comm_hook;
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
  // size). Stable for the life of the Client.
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

  // Chooses the job's communication hook after Attach; every local rank
  // must call it with the same hook before its first MarkReady. Errors:
  // INVALID_ARGUMENT (unknown hook, listing the supported ones; another
  // rank chose differently, naming both), FAILED_PRECONDITION (called
  // twice, or after the job's first bucket started).
  virtual absl::Status SetCommHook(const CommHookOptions& hook) = 0;

  // Clean goodbye (also done by the destructor).
  virtual absl::Status Detach() = 0;

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
