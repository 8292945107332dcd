#include "server/engine/manager/device_attach.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/device.h"
#include "server/engine/reduce/device_reducer.h"

namespace gradd {

absl::StatusOr<int> ResolveRankDevice(const v1::AttachRequest& request,
                                      const std::vector<ParamInfo>& params,
                                      DeviceAllocatorInterface& devices,
                                      const std::string& who) {
  const int daemon_driver_version = devices.driver_version();
  if (!HasCudaParams(params)) return -1;
  const v1::CudaDevice& gpu = request.cuda_device();
  const std::string gpu_name = absl::StrCat("cuda:", gpu.ordinal(), " (",
                                            FormatGpuUuid(gpu.uuid()), ")");
  absl::StatusOr<int> found = devices.FindDevice(gpu.uuid());
  if (!found.ok()) {
    return absl::Status(found.status().code(),
                        absl::StrCat(who, ", device ", gpu_name, ": ",
                                     found.status().message()));
  }
  if (gpu.driver_version() != 0 && daemon_driver_version != 0 &&
      gpu.driver_version() != daemon_driver_version) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ", device ", gpu_name, ": the trainer's CUDA driver is version ",
        gpu.driver_version(), " but the daemon's is ", daemon_driver_version,
        "; run both against the same driver"));
  }
  return *found;
}

}  // namespace gradd
