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
// collective never hangs the job. Several nodes: UNIMPLEMENTED until the
// NCCL unique id travels through the rendezvous store (the engine's
// multi-node formation owns the store).
//
// An event is re-recorded only after every wait on its previous record was
// enqueued (the engine starts bucket b of i + 1 only after every rank
// published i + 1, which each does after its stream waited on done of i).
// Communication hooks and join: UNIMPLEMENTED for CUDA buckets.
//
// Threads: Start / DescribeDevice on the engine thread (and JobManager's
// before Start); completions inline (one GPU) or on the watchdog thread.
// Errors name job, device and bucket.
#ifndef GRADD_SERVER_ENGINE_CUDA_CUDA_BUCKET_REDUCER_H_
#define GRADD_SERVER_ENGINE_CUDA_CUDA_BUCKET_REDUCER_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda/driver.h"
#include "common/cuda/owners.h"
#include "common/device_memory.h"
#include "server/backends/nccl/nccl_library.h"
#include "server/engine/bucket_reducer.h"
#include "server/engine/job.h"

namespace gradd {

class CudaBucketReducer final : public BucketReducerInterface {
 public:
  static absl::StatusOr<std::unique_ptr<BucketReducerInterface>> Create(
      const JobSpec& spec, std::unique_ptr<BucketReducerInterface> host);
  ~CudaBucketReducer() override;

  void Start(const BucketWork& work, Completion done) override;
  void StartBroadcast(const BroadcastWork& work, Completion done) override {
    host_->StartBroadcast(work, std::move(done));
  }
  void StartJoinRound(JoinRoundWork work, RoundCompletion done) override {
    host_->StartJoinRound(std::move(work), std::move(done));
  }
  ReducerStats stats() const override;
  void Replan(uint64_t first_iteration, int num_buckets) override {
    host_->Replan(first_iteration, num_buckets);
  }
  [[nodiscard]] absl::Status SetCommHook(
      std::unique_ptr<CommHookInterface> hook) override;
  void DescribeDevice(int rank, v1::AttachResponse* response) const override;

 private:
  // The local ranks on one GPU.
  struct Group {
    int device = -1;  // the daemon's ordinal
    std::vector<int> ranks;
    cuda::CudaStream stream;
    std::vector<cuda::CudaEvent> done;  // by bucket slot
    std::vector<std::string> done_handles;
    // Several GPUs: the accumulator (largest bucket, accumulator type).
    std::unique_ptr<DeviceMemoryInterface> acc;
  };
  struct InFlight {
    int bucket = 0;
    std::chrono::steady_clock::time_point deadline;
    Completion done;
  };

  CudaBucketReducer(const JobSpec& spec, const cuda::CudaDriver* driver,
                    std::unique_ptr<BucketReducerInterface> host);
  std::string Where(int bucket) const;
  absl::Status StartFused(const BucketWork& work);
  absl::Status StartCollective(const BucketWork& work);
  void Watch();

  const std::string job_id_;
  const int world_;
  const std::chrono::milliseconds timeout_;
  const cuda::CudaDriver* const driver_;
  std::unique_ptr<BucketReducerInterface> host_;
  std::vector<Group> groups_;
  std::vector<int> rank_group_;  // local rank -> index into groups_
  // ready_[r][slot], made on rank r's GPU; handles exported once.
  std::vector<std::vector<cuda::CudaEvent>> ready_;
  std::vector<std::vector<std::string>> ready_handles_;
  // Several GPUs.
  const nccl::NcclLibrary* nccl_ = nullptr;
  std::optional<nccl::NcclCommunicators> comms_;
  absl::Mutex mu_;
  std::deque<InFlight> in_flight_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watchdog_;
  std::atomic<uint64_t> buckets_{0};
  std::atomic<uint64_t> enqueue_ns_{0};
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_CUDA_CUDA_BUCKET_REDUCER_H_
