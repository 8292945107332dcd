// The trainer's side of CUDA buckets (the daemon's: server/engine/
// cuda/cuda_bucket_reducer.h): which GPU this rank is on, its device memory
// imported once from the fd the daemon sent, and the event handshake on the
// trainer's stream:
//
//   MarkReady completes bucket b  ─► RecordReady(b, stream): the stream
//       records ready[b] after the kernels that wrote the gradients, then
//       the client publishes ready_seq and rings (no host sync);
//   WaitAll sees done_seq[b] ─► WaitDone(b, stream): the stream waits on
//       done[b], so the optimizer's kernels run after the daemon's reduce.
//   RebuildBuckets (between iterations) ─► MoveGradients: every gradient
//       to its place in the new plan, inside the same device memory.
//
// Two implementations, chosen by the environment:
//   real (GRADD_HAVE_CUDA builds with a driver): cuMem import and IPC events
//       through the run-time-loaded driver (common/cuda/);
//   fake (GRADD_FAKE_GPU_UUID=<32 hex digits>, tests without a GPU): the
//       daemon runs with --fake_gpus and the "device memory" is a memfd;
//       mapped on the host, events are no-ops (the daemon's host reducer
//       has finished before it publishes done_seq).
// Errors name the device. Thread-compatible, except RecordReady (any
// thread: MarkReady's callers).
#ifndef GRADD_CLIENT_SRC_DEVICE_DEVICE_CLIENT_H_
#define GRADD_CLIENT_SRC_DEVICE_DEVICE_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/src/device/region_moves.h"
#include "common/shm.h"
#include "gradd/v1/node.pb.h"

namespace gradd {

class DeviceClient {
 public:
  virtual ~DeviceClient() = default;

  // The GPU `ordinal` (this process's numbering) for AttachRequest.
  // FAILED_PRECONDITION without a driver (and no fake).
  static absl::StatusOr<v1::CudaDevice> Describe(int ordinal);
  // Imports the rank's device memory (`fd`, response.device_memory_bytes())
  // and opens its events.
  static absl::StatusOr<std::unique_ptr<DeviceClient>> Import(
      int ordinal, UniqueFd fd, const v1::AttachResponse& response);

  // This process's address of the device memory's first byte.
  virtual char* base() const = 0;
  virtual size_t size() const = 0;
  [[nodiscard]] virtual absl::Status RecordReady(int bucket, void* stream) = 0;
  [[nodiscard]] virtual absl::Status WaitDone(int bucket, void* stream) = 0;
  // A bucket rebuild (client/src/plan/rebuild.h): applies `moves` (offsets in
  // the device memory, RegionMoves) and returns once they have landed.
  // First it waits for every GPU operation that may still touch the
  // gradients: the daemon's reduce of the last iteration (the done events
  // of `done_buckets`, the old plan's CUDA buckets) and this process's own
  // work on the device (the optimizer may still be reading gradients, or
  // zero_grad writing them, on any of the trainer's streams: the whole
  // context is synchronised, since the rebuild does not know them). The
  // copies go device -> host snapshot -> device on a stream of the
  // client's own. The host waits: this runs once per job, between
  // iterations (after WaitAll, before the next MarkReady), where torch's
  // DDP also copies its gradients into the new buckets; nothing queued
  // later can overtake it. Errors (INTERNAL or the driver's) are prefixed
  // with `who` and name the device.
  [[nodiscard]] virtual absl::Status MoveGradients(
      const std::vector<RegionMove>& moves,
      const std::vector<int>& done_buckets, absl::string_view who) = 0;
};

}  // namespace gradd

#endif  // GRADD_CLIENT_SRC_DEVICE_DEVICE_CLIENT_H_
