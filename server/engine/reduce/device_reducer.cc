#include "server/engine/reduce/device_reducer.h"

#include "absl/strings/str_cat.h"

#if GRADD_HAVE_CUDA
#include "server/engine/reduce/cuda/cuda_bucket_reducer.h"
#endif

namespace gradd {

bool HasCudaParams(const std::vector<ParamInfo>& params) {
  for (const ParamInfo& p : params) {
    if (p.device == DeviceKind::kCuda) return true;
  }
  return false;
}

bool UsesDeviceReducer(const std::vector<ParamInfo>& params,
                       const DeviceAllocatorInterface* devices) {
  return HasCudaParams(params) &&
         !(devices != nullptr && devices->host_addressable());
}

absl::StatusOr<std::unique_ptr<BucketReducerInterface>> WrapDeviceReducer(
    const DeviceJobSpec& spec, std::unique_ptr<BucketReducerInterface> host) {
  if (!UsesDeviceReducer(spec.params, spec.devices)) return host;
#if GRADD_HAVE_CUDA
  return CudaBucketReducer::Create(spec, std::move(host));
#else
  return absl::FailedPreconditionError(
      absl::StrCat("job '", spec.job_id,
                   "' has CUDA parameters but gradd was built without CUDA"));
#endif
}

}  // namespace gradd
