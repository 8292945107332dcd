#include "server/engine/manager/job_memory.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"

namespace gradd {

JobMemoryNeed JobMemoryNeedOf(const std::vector<ParamInfo>& params,
                              const BucketPlan& plan, uint64_t broadcast_bytes,
                              const std::vector<int>& rank_devices,
                              int num_nodes) {
  JobMemoryNeed need;
  need.ranks = static_cast<int>(std::max<size_t>(1, rank_devices.size()));
  // Room for any later plan (bucket rebuild) is reserved up front.
  need.shared_per_rank =
      std::max<uint64_t>(plan.total_bytes, MaxPlanBytes(params)) +
      broadcast_bytes;
  need.device_per_rank = std::max<uint64_t>(
      plan.device_bytes, MaxPlanBytes(params, DeviceKind::kCuda));
  absl::flat_hash_set<int> gpus;
  for (int d : rank_devices) {
    if (d >= 0) gpus.insert(d);
  }
  // Several local GPUs on one node: the NCCL path's accumulator per GPU,
  // the largest bucket any plan can have in the accumulator type.
  if (need.device_per_rank > 0 && gpus.size() > 1 && num_nodes <= 1) {
    uint64_t acc = 0;
    for (const ParamInfo& p : params) {
      if (p.device != DeviceKind::kCuda) continue;
      acc += p.numel() * DTypeSize(AccumulatorDType(p.dtype));
    }
    need.device_extra = acc * gpus.size();
  }
  return need;
}

absl::Status CheckJobMemory(const std::string& job_id,
                            const JobMemoryNeed& need, uint64_t limit) {
  if (need.total() <= limit) return absl::OkStatus();
  std::string device;
  if (need.device_bytes() > 0) {
    device =
        absl::StrCat(" and ", need.device_bytes(), " bytes of device memory (",
                     need.device_per_rank, " x ", need.ranks, " ranks");
    if (need.device_extra > 0) {
      absl::StrAppend(&device, " + ", need.device_extra,
                      " of per-GPU accumulators");
    }
    absl::StrAppend(&device, ")");
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "job '", job_id, "' needs ", need.shared_bytes(),
      " bytes of shared memory (", need.shared_per_rank, " x ", need.ranks,
      " ranks)", device, ", ", need.total(),
      " in all; the daemon's per-job limit (max_job_memory_bytes) is ", limit));
}

}  // namespace gradd
