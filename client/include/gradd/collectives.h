// gradd collectives: allreduce, allgather, reduce_scatter, barrier (and the
// existing broadcast) of arbitrary tensors between the ranks of a job,
// reduced by the daemons as gradient buckets are: the local ranks of a node
// in their daemon, then one inter-node collective per node through the
// job's collective backend (Gloo between daemons).
//
// The calls are methods of gradd::Client (client.h). Every rank of the job
// must issue the same sequence of collectives with the same kind, dtype,
// op, sizes and root (as with torch.distributed); the daemon checks it and
// fails the job with INVALID_ARGUMENT naming both ranks and both values
// when they disagree. Data of any size is sent in chunks through the
// rank's shared collective area (ClientOptions::collective_bytes).
#ifndef GRADD_CLIENT_INCLUDE_GRADD_COLLECTIVES_H_
#define GRADD_CLIENT_INCLUDE_GRADD_COLLECTIVES_H_

#include <cstddef>
#include <cstdint>

namespace gradd {

// Reduction of Allreduce / ReduceScatter; the same values as the C ABI's
// GRADD_SUM ... (gradd.h). kAvg divides the sum by the job's world size and
// is refused (INVALID_ARGUMENT) for integer dtypes, as torch's Gloo backend
// does. float16/bfloat16 are accumulated in float32.
enum class ReduceOp : int32_t { kSum = 0, kAvg = 1, kMin = 2, kMax = 3 };

// The collective area a collective-only job gets when
// ClientOptions::collective_bytes is 0: large enough that one chunk's
// copy and round trip dominate the daemon's per-chunk overhead, small
// enough to cost little shared memory per rank.
inline constexpr size_t kDefaultCollectiveBytes = size_t{4} << 20;

}  // namespace gradd

#endif  // GRADD_CLIENT_INCLUDE_GRADD_COLLECTIVES_H_
