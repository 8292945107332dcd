#include "server/engine/formation/cuda/nccl_job_platform.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/cuda/owners.h"
#include "common/status_macros.h"

namespace gradd {

NcclNodeOffer CudaNcclJobPlatform::Offer(const std::vector<int>& gpus,
                                         std::string* why_not) {
  NcclNodeOffer offer;
  if (!nccl_.ok()) {
    *why_not = std::string(nccl_.status().message());
    return offer;
  }
  if (!driver_.ok()) {
    *why_not = std::string(driver_.status().message());
    return offer;
  }
  const cuda::CudaDriver& d = **driver_;
  for (int g : gpus) {
    CUdevice dev = 0;
    CUuuid uuid;
    absl::Status s = cuda::CuCheck(d, d.cuDeviceGet(&dev, g),
                                   absl::StrCat("device ", g, ": cuDeviceGet"));
    if (s.ok()) {
      s = cuda::CuCheck(d, d.cuDeviceGetUuid(&uuid, dev),
                        absl::StrCat("device ", g, ": cuDeviceGetUuid"));
    }
    if (!s.ok()) {
      *why_not = std::string(s.message());
      offer.gpu_uuids.clear();
      return offer;
    }
    offer.gpu_uuids.emplace_back(uuid.bytes, sizeof(uuid.bytes));
  }
  offer.nccl = true;
  return offer;
}

absl::StatusOr<std::string> CudaNcclJobPlatform::MakeUniqueId() {
  RETURN_IF_ERROR(nccl_.status());
  const nccl::NcclLibrary& lib = **nccl_;
  ncclUniqueId id;
  RETURN_IF_ERROR(
      nccl::NcclCheck(lib, lib.ncclGetUniqueId(&id), "ncclGetUniqueId"));
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<NcclJobCommsInterface>>
CudaNcclJobPlatform::Connect(const std::string& unique_id, int world,
                             int first_rank, const std::vector<int>& gpus,
                             absl::Duration timeout,
                             const std::string& context) {
  RETURN_IF_ERROR(nccl_.status());
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(
        absl::StrCat(context, ": the NCCL unique id has ", unique_id.size(),
                     " bytes, not ", sizeof(id.internal)));
  }
  RETURN_IF_ERROR(driver_.status());
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  ASSIGN_OR_RETURN(
      nccl::NcclCommunicators comms,
      nccl::NcclCommunicators::Create(*nccl_, *driver_, id, world, first_rank,
                                      gpus, context, timeout));
  return std::unique_ptr<NcclJobCommsInterface>(
      std::make_unique<NcclJobComms>(*nccl_, std::move(comms)));
}

}  // namespace gradd
