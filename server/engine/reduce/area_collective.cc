#include "server/engine/reduce/area_collective.h"

#include <cstdint>
#include <cstring>
#include <limits>

namespace gradd {
namespace {

// The areas that take part (every one outside join mode).
std::vector<void*> Areas(const BroadcastWork& work) {
  std::vector<void*> areas;
  for (void* a : *work.rank_areas) {
    if (a != nullptr) areas.push_back(a);
  }
  return areas;
}

}  // namespace

size_t AreaBytesNeeded(CollectiveKind kind, size_t bytes, int world_size) {
  if (kind != CollectiveKind::kAllgather) return bytes;
  const size_t n = static_cast<size_t>(world_size > 0 ? world_size : 1);
  if (bytes > std::numeric_limits<size_t>::max() / n) {
    return std::numeric_limits<size_t>::max();
  }
  return bytes * n;
}

AreaNetworkStep PrepareAreaCollective(const BroadcastWork& work,
                                      std::vector<char>* scratch) {
  AreaNetworkStep step;
  const std::vector<void*> areas = Areas(work);
  if (areas.empty()) return step;
  switch (work.kind) {
    case CollectiveKind::kAllreduce:
    case CollectiveKind::kReduceScatter: {
      const CollectiveDType acc_type = ReductionAccumulator(work.dtype);
      const size_t count = work.bytes / CollectiveDTypeSize(work.dtype);
      void* acc = areas[0];
      if (acc_type != work.dtype) {
        scratch->resize(count * CollectiveDTypeSize(acc_type));
        acc = scratch->data();
      }
      ReduceToAccumulator(work.dtype, work.op, areas.data(),
                          static_cast<int>(areas.size()), acc, 0, count);
      step.data = acc;
      step.count = count;
      step.elem_bytes = CollectiveDTypeSize(acc_type);
      step.combine = CombineFunction(acc_type, work.op);
      return step;
    }
    case CollectiveKind::kAllgather: {
      const size_t block = work.bytes;
      const size_t total =
          AreaBytesNeeded(CollectiveKind::kAllgather, block, work.world_size);
      scratch->assign(total, 0);
      const std::vector<void*>& by_rank = *work.rank_areas;
      for (size_t r = 0; r < by_rank.size(); ++r) {
        if (by_rank[r] == nullptr || block == 0) continue;
        std::memcpy(scratch->data() + (work.first_rank + r) * block, by_rank[r],
                    block);
      }
      step.data = scratch->data();
      step.count = total;
      step.elem_bytes = 1;
      step.combine =
          CombineFunction(CollectiveDType::kUInt8, CollectiveOp::kSum);
      return step;
    }
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kBarrier:
      break;
  }
  return step;
}

void FinishAreaCollective(const BroadcastWork& work,
                          const AreaNetworkStep& step) {
  const std::vector<void*> areas = Areas(work);
  if (areas.empty() || step.count == 0) return;
  switch (work.kind) {
    case CollectiveKind::kAllreduce:
    case CollectiveKind::kReduceScatter:
      WriteFromAccumulator(work.dtype, work.op, step.data, work.world_size,
                           areas.data(), static_cast<int>(areas.size()), 0,
                           step.count);
      return;
    case CollectiveKind::kAllgather:
      for (void* a : areas) std::memcpy(a, step.data, step.count);
      return;
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kBarrier:
      return;
  }
}

void RunLocalAreaCollective(const BroadcastWork& work,
                            std::vector<char>* scratch) {
  FinishAreaCollective(work, PrepareAreaCollective(work, scratch));
}

}  // namespace gradd
