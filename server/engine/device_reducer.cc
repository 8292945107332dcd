#include "server/engine/device_reducer.h"

#include "absl/strings/str_cat.h"
#include "server/engine/device_attach.h"

#if GRADD_HAVE_CUDA
#include "server/engine/cuda/cuda_bucket_reducer.h"
#endif

namespace gradd {

absl::StatusOr<std::unique_ptr<BucketReducerInterface>> WrapDeviceReducer(
    const JobSpec& spec, std::unique_ptr<BucketReducerInterface> host) {
  if (!HasCudaParams(spec.params)) return host;
  if (spec.devices != nullptr && spec.devices->host_addressable()) return host;
#if GRADD_HAVE_CUDA
  return CudaBucketReducer::Create(spec, std::move(host));
#else
  return absl::FailedPreconditionError(
      absl::StrCat("job '", spec.job_id,
                   "' has CUDA parameters but gradd was built without CUDA"));
#endif
}

}  // namespace gradd
