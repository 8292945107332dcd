// The node-local halves of a collective round on the ranks' collective
// areas (common/control_block.h, BroadcastWork::kind other than broadcast),
// shared by the single-node path (BucketReducerInterface::StartBroadcast's
// default) and the multi-node one (HierarchicalReducer), which puts one
// CollectiveBackendInterface::AllreduceWith between them:
//
//   allreduce,       local: the op over every local rank's area into an
//   reduce_scatter   accumulator (local rank 0's area itself, or a float32
//                    scratch for float16/bfloat16); network: the same op
//                    across nodes; write-back: the result (avg: / world
//                    size, rounded to the dtype) into every area.
//   allgather        local: each local rank's block into its global place
//                    of a zeroed world-size scratch; network: a uint8 sum
//                    (exact: every byte has one non-zero contributor), which
//                    needs no equal block counts per node (local world
//                    sizes may differ) at the cost of moving the whole
//                    world-size buffer; write-back: the scratch into every
//                    area.
//   barrier          nothing to move: the round itself (and across nodes
//                    the description check that precedes it) is the
//                    barrier.
//
// Single-threaded per round (the engine or network thread that owns it).
#ifndef GRADD_SERVER_ENGINE_REDUCE_AREA_COLLECTIVE_H_
#define GRADD_SERVER_ENGINE_REDUCE_AREA_COLLECTIVE_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "common/collective_reduce.h"
#include "server/engine/reduce/bucket_reducer.h"

namespace gradd {

// What goes between the nodes: `count` elements of `elem_bytes` at `data`,
// combined with `combine` (count 0: nothing).
struct AreaNetworkStep {
  void* data = nullptr;
  size_t count = 0;
  size_t elem_bytes = 1;
  CombineFn combine = nullptr;
};

// The local half of `work` (not a broadcast); `scratch` holds what the
// areas cannot and must live until FinishAreaCollective.
AreaNetworkStep PrepareAreaCollective(const BroadcastWork& work,
                                      std::vector<char>* scratch);
// Writes the (network-combined) `step` back into every area of `work`.
void FinishAreaCollective(const BroadcastWork& work,
                          const AreaNetworkStep& step);
// Both halves with no network: the single-node round.
void RunLocalAreaCollective(const BroadcastWork& work,
                            std::vector<char>* scratch);

// The area bytes a round needs: `bytes`, or world_size * bytes for
// allgather (nullopt-free: saturates at SIZE_MAX on overflow).
size_t AreaBytesNeeded(CollectiveKind kind, size_t bytes, int world_size);

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_REDUCE_AREA_COLLECTIVE_H_
