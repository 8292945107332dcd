// Collectives of arbitrary data through a rank's shared collective area:
// how Allreduce, Allgather, ReduceScatter, Barrier and Broadcast of any size
// are split into rounds of at most the area's size, and how each round's
// data is packed into the area and read back (common/control_block.h says
// what the daemon does with the area per CollectiveKind).
//
//   caller buffer --copy chunk--> area --Round()--> area --copy--> buffer
//
// Every rank computes the same split from the same sizes, so the daemon
// sees the same sequence of rounds from every rank and checks each one's
// description (kind, dtype, op, bytes, root). Zero-size calls still run one
// (empty) round, so that a rank that passes 0 where the others pass data is
// caught, not left to hang the next call.
//
// Owns nothing: the area, the round itself (publish + bounded wait) and the
// client's state checks belong to the CollectiveAreaInterface, which
// gradd::Client implements over its control block (client_impl.h) and tests
// fake. Threads: the client's one caller thread (the thread that issues
// collectives), as for every call on the interface. Depends only on
// common/ (control_block.h's CollectiveKind, collective_reduce.h) and the
// public gradd/collectives.h; nothing here knows about sockets, gRPC or the
// control block's layout.
//
// Errors: INVALID_ARGUMENT for a bad dtype / op / root or a null buffer,
// FAILED_PRECONDITION when there is no area or it is too small for one
// element (per rank), and whatever Usable() or Round() return.
#ifndef GRADD_CLIENT_SRC_DATA_AREA_COLLECTIVES_H_
#define GRADD_CLIENT_SRC_DATA_AREA_COLLECTIVES_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/control_block.h"
#include "gradd/collectives.h"

namespace gradd {

// One rank's collective area and its rounds.
class CollectiveAreaInterface {
 public:
  virtual ~CollectiveAreaInterface() = default;

  // The rank's shared area (nullptr when area_bytes() is 0) and its size.
  virtual char* area() = 0;
  virtual size_t area_bytes() const = 0;
  // This rank's global rank and the job's global world size.
  virtual int global_rank() const = 0;
  virtual int world_size() const = 0;
  // Names the job and rank in error messages ("job 'j', local rank 0").
  virtual std::string Who() const = 0;
  // OK when a collective other than Broadcast may run now (the client is
  // healthy, not in join mode); `what` names the call in errors. Broadcast
  // does not ask: its caller checks its own state first (Broadcast is also
  // how join mode syncs).
  virtual absl::Status Usable(absl::string_view what) const = 0;
  // One round on the area, whose contents the caller has written:
  // publishes (kind, dtype, op, bytes, root) and blocks (bounded) until the
  // daemon has finished it; the area then holds the result.
  virtual absl::Status Round(CollectiveKind kind, int32_t dtype, int32_t op,
                             uint64_t bytes, int32_t root) = 0;
};

// The calls of gradd::Client (collectives.h, client.h) over `area`, with
// their argument checks and error messages.
absl::Status AreaAllreduce(CollectiveAreaInterface& area, void* data,
                           size_t count, int32_t dtype, ReduceOp op);
absl::Status AreaAllgather(CollectiveAreaInterface& area, const void* input,
                           size_t bytes, void* output);
absl::Status AreaReduceScatter(CollectiveAreaInterface& area, const void* input,
                               void* output, size_t count, int32_t dtype,
                               ReduceOp op);
absl::Status AreaBarrier(CollectiveAreaInterface& area);
absl::Status AreaBroadcast(CollectiveAreaInterface& area, void* data,
                           size_t bytes, int root);

}  // namespace gradd

#endif  // GRADD_CLIENT_SRC_DATA_AREA_COLLECTIVES_H_
