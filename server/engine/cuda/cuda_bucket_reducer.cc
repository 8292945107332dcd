#include "server/engine/cuda/cuda_bucket_reducer.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/cuda/device_reduce.h"
#include "common/status_macros.h"

namespace gradd {

absl::StatusOr<std::unique_ptr<BucketReducerInterface>>
CudaBucketReducer::Create(const JobSpec& spec,
                          std::unique_ptr<BucketReducerInterface> host) {
  const std::string job = absl::StrCat("job '", spec.job_id, "'");
  ASSIGN_OR_RETURN(const cuda::CudaDriver* driver, cuda::CudaDriver::Get());
  if (spec.rank_devices.empty()) {
    return absl::InternalError(absl::StrCat(job, ": no rank devices"));
  }
  const int device = spec.rank_devices[0];
  for (size_t r = 1; r < spec.rank_devices.size(); ++r) {
    if (spec.rank_devices[r] != device) {
      return absl::UnimplementedError(absl::StrCat(
          job, ": local ranks 0 and ", r,
          " are on different GPUs (daemon "
          "devices ",
          device, " and ", spec.rank_devices[r],
          "); ranks on several GPUs need the job's NCCL communicator, which "
          "this daemon does not drive yet"));
    }
  }
  if (spec.num_nodes > 1) {
    return absl::UnimplementedError(
        absl::StrCat(job, " spans ", spec.num_nodes,
                     " nodes with CUDA parameters; the "
                     "NCCL path between nodes is not wired yet"));
  }
  if (spec.local_world_size > cuda::kMaxDeviceBuffers) {
    return absl::ResourceExhaustedError(absl::StrCat(
        job, ": ", spec.local_world_size, " ranks share device ", device,
        "; the fused device reducer takes at most ", cuda::kMaxDeviceBuffers));
  }
  std::unique_ptr<CudaBucketReducer> r(new CudaBucketReducer(
      spec.job_id, device, spec.local_world_size, driver, std::move(host)));
  const std::string where = absl::StrCat(job, " device ", device);
  RETURN_IF_ERROR(cuda::UseDevice(*driver, device, where));
  ASSIGN_OR_RETURN(r->stream_, cuda::CudaStream::Create(driver, where));
  const size_t slots = std::max(spec.plan.buckets.size(), spec.params.size());
  r->ready_.resize(spec.local_world_size);
  r->ready_handles_.resize(spec.local_world_size);
  for (size_t b = 0; b < slots; ++b) {
    const std::string at = absl::StrCat(where, " bucket slot ", b);
    ASSIGN_OR_RETURN(
        cuda::CudaEvent done,
        cuda::CudaEvent::Create(driver, /*interprocess=*/true, at));
    ASSIGN_OR_RETURN(std::string handle, done.IpcHandle(at));
    r->done_.push_back(std::move(done));
    r->done_handles_.push_back(std::move(handle));
    for (int k = 0; k < spec.local_world_size; ++k) {
      const std::string rank_at = absl::StrCat(at, " rank ", k);
      ASSIGN_OR_RETURN(cuda::CudaEvent ready,
                       cuda::CudaEvent::Create(driver, true, rank_at));
      ASSIGN_OR_RETURN(std::string rh, ready.IpcHandle(rank_at));
      r->ready_[k].push_back(std::move(ready));
      r->ready_handles_[k].push_back(std::move(rh));
    }
  }
  return std::unique_ptr<BucketReducerInterface>(std::move(r));
}

CudaBucketReducer::~CudaBucketReducer() {
  // Work still queued reads the ranks' memory, which the Job frees after
  // us: let it drain (bounded by one bucket's kernels).
  if (stream_.get() != nullptr &&
      cuda::UseDevice(*driver_, device_, "shutdown").ok()) {
    driver_->cuStreamSynchronize(stream_.get());
  }
}

std::string CudaBucketReducer::Where(int bucket) const {
  return absl::StrCat("job '", job_id_, "' device ", device_, " bucket ",
                      bucket);
}

void CudaBucketReducer::Start(const BucketWork& work, Completion done) {
  if (work.device != DeviceKind::kCuda) {
    host_->Start(work, std::move(done));
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::string where = Where(work.bucket);
  auto run = [&]() -> absl::Status {
    if (work.bucket < 0 || static_cast<size_t>(work.bucket) >= done_.size()) {
      return absl::InternalError(absl::StrCat(where, ": no event slot"));
    }
    RETURN_IF_ERROR(cuda::UseDevice(*driver_, device_, where));
    // Every rank's ready event: one that did not record this iteration
    // (a joined rank) has completed long ago, or never recorded, and
    // waiting on it is free.
    for (int k = 0; k < world_; ++k) {
      RETURN_IF_ERROR(cuda::CuCheck(
          *driver_,
          driver_->cuStreamWaitEvent(stream_.get(),
                                     ready_[k][work.bucket].get(), 0),
          absl::StrCat(where, " rank ", k, ": cuStreamWaitEvent")));
    }
    const std::vector<void*>& buffers = *work.rank_buffers;
    if (!buffers.empty()) {
      const double divisor = work.divisor > 0 ? work.divisor : world_;
      RETURN_IF_ERROR(cuda::DeviceFusedAverage(
          work.dtype, buffers.data(), static_cast<int>(buffers.size()),
          work.count, divisor, stream_.get(), where));
    }
    return cuda::CuCheck(
        *driver_,
        driver_->cuEventRecord(done_[work.bucket].get(), stream_.get()),
        absl::StrCat(where, ": cuEventRecord"));
  };
  absl::Status s = run();
  buckets_.fetch_add(1, std::memory_order_relaxed);
  enqueue_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now() - t0)
                            .count(),
                        std::memory_order_relaxed);
  std::move(done)(std::move(s));
}

ReducerStats CudaBucketReducer::stats() const {
  ReducerStats s = host_->stats();
  s.buckets += buckets_.load(std::memory_order_relaxed);
  s.local_reduce_ns += enqueue_ns_.load(std::memory_order_relaxed);
  return s;
}

absl::Status CudaBucketReducer::SetCommHook(
    std::unique_ptr<CommHookInterface> hook) {
  if (hook == nullptr) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat("job '", job_id_,
                   "' has CUDA parameters; communication hooks run on "
                   "host memory and are not supported for CUDA buckets yet"));
}

void CudaBucketReducer::DescribeDevice(int rank,
                                       v1::AttachResponse* response) const {
  if (rank < 0 || rank >= world_) return;
  for (const std::string& h : ready_handles_[rank]) {
    response->add_ready_events(h);
  }
  for (const std::string& h : done_handles_) response->add_done_events(h);
}

}  // namespace gradd
