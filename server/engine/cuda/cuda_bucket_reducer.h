// The reducer of jobs with CUDA buckets on real GPUs (device_reducer.h).
// CPU buckets (e.g. the client's used map) go to the host reducer it wraps;
// CUDA buckets are reduced on the GPU without the daemon or the trainer
// blocking on it:
//
//   trainer stream: ... backward kernels ... record ready[r][b] ─┐
//   trainer CPU:    ready_seq[b] = i, ring                       │
//   daemon engine:  sees every rank ready ─► daemon stream waits on each
//                   ready[r][b] ─► fused average kernel (all ranks' bucket
//                   b, in place) ─► record done[b] ─► done_seq[b] = i
//   trainer:        sees done_seq, its stream waits on done[b], then the
//                   optimizer's kernels read the gradients.
//
// An event is re-recorded only after every wait on its previous record was
// enqueued (the engine starts bucket b of i + 1 only after every rank
// published i + 1, which each does after its stream waited on done[b] of
// i), so waits always see the record of their own iteration.
//
// Scope today: every local rank on one GPU, one node (the fused kernel).
// Ranks on different GPUs or several nodes need the job's NCCL
// communicator (server/backends/nccl/nccl_backend.h); Create answers
// UNIMPLEMENTED for them until that is wired. Communication hooks:
// UNIMPLEMENTED (they run on host memory).
//
// Threads: Start / DescribeDevice on the engine thread (and JobManager's
// before Start); completes inline. Errors name job, device and bucket.
#ifndef GRADD_SERVER_ENGINE_CUDA_CUDA_BUCKET_REDUCER_H_
#define GRADD_SERVER_ENGINE_CUDA_CUDA_BUCKET_REDUCER_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda/driver.h"
#include "common/cuda/owners.h"
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
  CudaBucketReducer(std::string job_id, int device, int world,
                    const cuda::CudaDriver* driver,
                    std::unique_ptr<BucketReducerInterface> host)
      : job_id_(std::move(job_id)),
        device_(device),
        world_(world),
        driver_(driver),
        host_(std::move(host)) {}
  std::string Where(int bucket) const;

  const std::string job_id_;
  const int device_;  // the daemon's ordinal of the job's GPU
  const int world_;
  const cuda::CudaDriver* const driver_;
  std::unique_ptr<BucketReducerInterface> host_;
  cuda::CudaStream stream_;
  // ready_[r][slot], done_[slot]; handles exported once at Create.
  std::vector<std::vector<cuda::CudaEvent>> ready_;
  std::vector<cuda::CudaEvent> done_;
  std::vector<std::vector<std::string>> ready_handles_;
  std::vector<std::string> done_handles_;
  std::atomic<uint64_t> buckets_{0};
  std::atomic<uint64_t> enqueue_ns_{0};
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_CUDA_CUDA_BUCKET_REDUCER_H_
