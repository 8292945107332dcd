#include "server/engine/reduce/device_reducer.h"

#include "absl/strings/str_cat.h"
#include "server/engine/manager/device_attach.h"

#if GRADD_HAVE_CUDA
#include "server/engine/formation/cuda/nccl_job_platform.h"
#include "server/engine/reduce/cuda/cuda_bucket_reducer.h"
#endif

namespace gradd {

bool UsesDeviceReducer(const JobSpec& spec) {
  return HasCudaParams(spec.params) &&
         !(spec.devices != nullptr && spec.devices->host_addressable());
}

absl::StatusOr<std::unique_ptr<BucketReducerInterface>> WrapDeviceReducer(
    const JobSpec& spec, std::unique_ptr<BucketReducerInterface> host) {
  if (!UsesDeviceReducer(spec)) return host;
#if GRADD_HAVE_CUDA
  return CudaBucketReducer::Create(spec, std::move(host));
#else
  return absl::FailedPreconditionError(
      absl::StrCat("job '", spec.job_id,
                   "' has CUDA parameters but gradd was built without CUDA"));
#endif
}

NcclJobPlatformInterface* DaemonNcclJobPlatform() {
#if GRADD_HAVE_CUDA
  static NcclJobPlatformInterface* platform = new CudaNcclJobPlatform(
      nccl::NcclLibrary::Get(), cuda::CudaDriver::Get());
  return platform;
#else
  return nullptr;
#endif
}

}  // namespace gradd
