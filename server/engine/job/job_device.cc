// Job's GPU side: each rank's device allocation for the plan's CUDA
// buckets, made on the rank's GPU by the job's device allocator and handed
// to the rank as an fd (the fifth one of the fd message); and what the
// device reducer is given of the job (JobSpec::device_spec).
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/engine/job/job.h"

namespace gradd {

DeviceJobSpec JobSpec::device_spec() const {
  DeviceJobSpec d;
  d.job_id = job_id;
  d.local_world_size = local_world_size;
  d.node_rank = node_rank;
  d.num_nodes = num_nodes;
  d.world_size = global_world_size();
  d.params = params;
  d.plan = plan;
  d.devices = devices;
  d.rank_devices = rank_devices;
  d.collective_timeout = collective_timeout;
  d.nccl_between_nodes = nccl_between_nodes;
  return d;
}

absl::Status Job::AllocateDeviceMemory() {
  device_region_bytes_ = MaxPlanBytes(spec_.params, DeviceKind::kCuda);
  if (device_region_bytes_ == 0) return absl::OkStatus();
  const int world = spec_.local_world_size;
  if (spec_.devices == nullptr ||
      spec_.rank_devices.size() != static_cast<size_t>(world)) {
    return absl::FailedPreconditionError(
        "the job has CUDA parameters but no device allocator");
  }
  for (int r = 0; r < world; ++r) {
    const std::string who =
        absl::StrCat("local rank ", r, ", device ", spec_.rank_devices[r]);
    absl::StatusOr<std::unique_ptr<DeviceMemoryInterface>> mem =
        spec_.devices->Allocate(spec_.rank_devices[r], device_region_bytes_);
    if (!mem.ok()) {
      return absl::Status(mem.status().code(),
                          absl::StrCat(who, ": ", mem.status().message()));
    }
    absl::StatusOr<UniqueFd> fd = (*mem)->Export();
    if (!fd.ok()) {
      return absl::Status(fd.status().code(),
                          absl::StrCat(who, ": ", fd.status().message()));
    }
    device_fds_.push_back(*std::move(fd));
    device_memory_.push_back(*std::move(mem));
  }
  return absl::OkStatus();
}

}  // namespace gradd
