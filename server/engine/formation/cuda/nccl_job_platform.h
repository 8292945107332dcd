// The NCCL platform of a multi-node CUDA job on real GPUs
// (nccl_job_setup.h): whether libnccl.so.2 loaded and the GPUs' UUIDs
// (the offer), ncclGetUniqueId, and non-blocking communicators created in
// one group call, aborted when the timeout passes. NcclJobComms is what
// CudaBucketReducer takes over (it downcasts the setup's communicators).
//
// The library and the driver come in through the constructor, so a test
// passes a library that did not load (NcclLibrary::Load of a missing
// path) and sees the node offer no NCCL, without a GPU. Thread-compatible
// (the formation thread).
#ifndef GRADD_SERVER_ENGINE_FORMATION_CUDA_NCCL_JOB_PLATFORM_H_
#define GRADD_SERVER_ENGINE_FORMATION_CUDA_NCCL_JOB_PLATFORM_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda/driver.h"
#include "server/backends/nccl/nccl_library.h"
#include "server/engine/formation/nccl_job_setup.h"

namespace gradd {

class NcclJobComms final : public NcclJobCommsInterface {
 public:
  NcclJobComms(const nccl::NcclLibrary* nccl, nccl::NcclCommunicators comms)
      : nccl_(nccl), comms_(std::move(comms)) {}
  void Abort() override { comms_.Abort(); }
  const nccl::NcclLibrary* library() const { return nccl_; }
  nccl::NcclCommunicators& comms() { return comms_; }

 private:
  const nccl::NcclLibrary* nccl_;
  nccl::NcclCommunicators comms_;
};

class CudaNcclJobPlatform final : public NcclJobPlatformInterface {
 public:
  // NcclLibrary::Get() / CudaDriver::Get() in the daemon.
  CudaNcclJobPlatform(absl::StatusOr<const nccl::NcclLibrary*> nccl,
                      absl::StatusOr<const cuda::CudaDriver*> driver)
      : nccl_(std::move(nccl)), driver_(std::move(driver)) {}

  NcclNodeOffer Offer(const std::vector<int>& gpus,
                      std::string* why_not) override;
  absl::StatusOr<std::string> MakeUniqueId() override;
  absl::StatusOr<std::unique_ptr<NcclJobCommsInterface>> Connect(
      const std::string& unique_id, int world, int first_rank,
      const std::vector<int>& gpus, absl::Duration timeout,
      const std::string& context) override;

 private:
  absl::StatusOr<const nccl::NcclLibrary*> nccl_;
  absl::StatusOr<const cuda::CudaDriver*> driver_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_FORMATION_CUDA_NCCL_JOB_PLATFORM_H_
