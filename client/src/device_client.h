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
#ifndef GRADD_CLIENT_SRC_DEVICE_CLIENT_H_
#define GRADD_CLIENT_SRC_DEVICE_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
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
};

}  // namespace gradd

#endif  // GRADD_CLIENT_SRC_DEVICE_CLIENT_H_
