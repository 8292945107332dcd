// HostStaging: the path of a device reducer for the buckets only the host
// reducers can reduce -- communication hooks, join iterations (a subset of
// the ranks contributes) and multi-node jobs without a device collective
// between the nodes (device_reducer.h). The bucket is copied from every
// contributing rank's device memory into host staging buffers, the wrapped
// host reducer (FusedReducer, HierarchicalReducer: hooks, join rounds and
// Gloo between nodes are all theirs) runs on those, and the result is
// copied back into every contributing rank's device bucket:
//
//   engine thread   Start: per contributing rank, device stream waits on
//                   the rank's ready event, copy device -> staging[b][r]
//                   (StagingDeviceInterface::CopyToHost; never blocks);
//                   queue the bucket for the staging thread
//   staging thread  WaitForHost (bounded by copy_timeout), then the host
//                   reducer's Start on a BucketWork whose rank_buffers are
//                   the staging buffers (device kCpu)
//   host reducer's  CopyToDevice: staging -> each rank's device bucket,
//   completion      then the done events on the devices' streams; then
//                   the engine's completion (the trainers' streams wait on
//                   done, so nothing here waits for the copy back)
//
// Why stage instead of running hooks and join on the device: the hooks
// (server/hooks/) and the join and multi-node machinery of the host
// reducers are the tested implementations of torch's semantics; running
// them on a copy costs two PCIe transfers per bucket, only in the cases
// that need them, and keeps one implementation of each. The single-GPU
// fused path and the NCCL path stay copy-free.
//
// Staging buffers are host memory from the device (pinned on CUDA, so the
// copies are asynchronous), one per bucket and contributing rank, allocated
// on the bucket's first staged Start and kept until the plan changes
// (Replan: freed once the devices have finished the copies back, re-made
// at the new plan's sizes); at most every rank's bucket region, held by
// the daemon's process (host_bytes()).
//
// Threads: Start and Replan on the engine thread; the staging thread is
// the only caller of the host reducer's Start made through StartOnHost
// (which the owner serialises with its own calls); completions run on the
// host reducer's completion thread, or on the staging thread when a copy
// fails. Errors name job, bucket, iteration and (from the device) rank and
// device. Stop() (or destruction) completes what is still queued with
// CANCELLED and joins the staging thread; buckets already with the host
// reducer complete through it.
#ifndef GRADD_SERVER_ENGINE_REDUCE_HOST_STAGING_H_
#define GRADD_SERVER_ENGINE_REDUCE_HOST_STAGING_H_

#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/engine/reduce/bucket_reducer.h"

namespace gradd {

// What the staging needs from the devices. Implementations: the CUDA one
// inside CudaBucketReducer; FakeStagingDevice in the unit test.
class StagingDeviceInterface {
 public:
  struct Copy {
    int rank = 0;  // local rank
    void* host = nullptr;
    void* device = nullptr;  // the rank's bucket, daemon's device address
    size_t bytes = 0;
  };
  virtual ~StagingDeviceInterface() = default;
  // `bytes` of host memory the device copies to and from asynchronously,
  // near local rank `rank`'s GPU. RESOURCE_EXHAUSTED when none is left.
  virtual absl::StatusOr<void*> AllocateHost(int rank, size_t bytes,
                                             absl::string_view context) = 0;
  virtual void FreeHost(void* host) = 0;
  // Engine thread; never blocks. For each copy, in its device's stream
  // order: wait until the rank made `bucket` ready, then device -> host.
  [[nodiscard]] virtual absl::Status CopyToHost(int bucket,
                                                absl::Span<const Copy> copies,
                                                absl::string_view context) = 0;
  // Staging thread. Blocks until the copies of the last CopyToHost of
  // `bucket` have landed; DEADLINE_EXCEEDED after `deadline`.
  [[nodiscard]] virtual absl::Status WaitForHost(int bucket,
                                                 absl::Span<const Copy> copies,
                                                 absl::Time deadline,
                                                 absl::string_view context) = 0;
  // Any thread; never blocks. For each copy host -> device, then marks
  // `bucket` done on the devices the copies went to.
  [[nodiscard]] virtual absl::Status CopyToDevice(
      int bucket, absl::Span<const Copy> copies, absl::string_view context) = 0;
  // Engine thread (a plan switch). Blocks until every copy queued so far
  // has finished -- the copies back of the last iteration, which nobody
  // on the host waited for (the trainers' streams wait on the done
  // events) -- so the buffers they read can be freed. DEADLINE_EXCEEDED
  // after `deadline`.
  [[nodiscard]] virtual absl::Status Drain(absl::Time deadline,
                                           absl::string_view context) = 0;
};

class HostStaging {
 public:
  using Completion = BucketReducerInterface::Completion;
  // Hands the staged bucket to the host reducer (the owner serialises it
  // with its other host reducer calls).
  using StartOnHost = absl::AnyInvocable<void(const BucketWork&, Completion)>;
  struct Options {
    std::string job_id;
    int local_world_size = 1;
    // Bound on the copies to host (a device that never finishes them).
    absl::Duration copy_timeout = absl::Seconds(30);
  };

  // `device` outlives this object.
  HostStaging(Options options, StagingDeviceInterface* device,
              StartOnHost start_on_host);
  ~HostStaging();  // Stop()s, then frees the staging buffers
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  // Engine thread. `work.rank_buffers` (device addresses) and `work.ranks`
  // stay valid until `done`.
  void Start(const BucketWork& work, Completion done);
  // Engine thread, no bucket in flight: the plan changed (bucket rebuild).
  // Once the devices have drained the copies back (Drain, bounded by
  // copy_timeout) the buffers are freed and re-made at the new sizes on
  // first use. When the drain fails the buffers are kept (freed at
  // destruction, after the owner's streams stopped) and every later Start
  // fails with that error, which Replan returns too.
  [[nodiscard]] absl::Status Replan();
  // Completes every queued bucket with CANCELLED and joins the staging
  // thread; later Starts complete with CANCELLED at once. Idempotent.
  void Stop();
  // Host staging memory held now. Any thread.
  size_t host_bytes() const;

 private:
  struct Buffer {
    void* host = nullptr;
    size_t bytes = 0;
  };
  struct Item {
    BucketWork work;  // rank_buffers point at host_buffers, device kCpu
    std::vector<void*> host_buffers;
    std::vector<StagingDeviceInterface::Copy> copies;
    std::string where;
    absl::Time deadline;
    Completion done;
  };

  void Loop();
  void Run(std::shared_ptr<Item> item);
  void FreeAll();

  const Options options_;
  StagingDeviceInterface* const device_;
  StartOnHost start_on_host_;
  // staging_[bucket][rank]; engine thread (and the destructor).
  std::vector<std::vector<Buffer>> staging_;
  // A failed Replan: the buffers may still be read by queued copies.
  absl::Status broken_;  // engine thread

  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Item>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  size_t host_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_REDUCE_HOST_STAGING_H_
