// The handler the gRPC Node service forwards to (rpc/node_service.h).
// Implemented by the engine's JobManager; tests call it directly.
//
// Calls return at once; the result arrives through the callback, invoked
// exactly once from the handler's own thread. The handler answers an Attach
// by its deadline at the latest (DEADLINE_EXCEEDED), so callers may wait on
// the callback without a timer of their own.
#ifndef GRADD_SERVER_RPC_NODE_HANDLER_H_
#define GRADD_SERVER_RPC_NODE_HANDLER_H_

#include <cstdint>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradd/v1/node.pb.h"

namespace gradd {

class NodeHandlerInterface {
 public:
  using AttachCallback =
      absl::AnyInvocable<void(absl::StatusOr<v1::AttachResponse>) &&>;
  using DetachCallback = absl::AnyInvocable<void(absl::Status) &&>;
  using RebuildCallback =
      absl::AnyInvocable<void(absl::StatusOr<v1::RebuildBucketsResponse>) &&>;
  using SetCommHookCallback = absl::AnyInvocable<void(absl::Status) &&>;

  virtual ~NodeHandlerInterface() = default;

  // Thread-safe.
  virtual void HandleAttach(v1::AttachRequest request, absl::Time deadline,
                            AttachCallback done) = 0;
  virtual void HandleDetach(v1::DetachRequest request, DetachCallback done) = 0;
  // Answered by `deadline` at the latest, possibly from a thread of the
  // job's own (engine/job/rebuild.h). The default: UNIMPLEMENTED.
  virtual void HandleRebuildBuckets(v1::RebuildBucketsRequest request,
                                    absl::Time deadline, RebuildCallback done) {
    std::move(done)(
        absl::UnimplementedError("this gradd daemon cannot rebuild buckets"));
  }

  // The client of session `session_id`'s Attach gave up before it was
  // answered (it cancelled, its deadline passed or its connection closed):
  // the handler drops that rank's pending attach, if it still has one, and
  // answers its callback (CANCELLED; nobody reads it). A session has at
  // most one Attach pending. Thread-safe; returns at once. The default
  // keeps the attach until its deadline.
  virtual void HandleAttachCancelled(uint64_t session_id) {}

  // Immediate (no waiting on other ranks).
  virtual void HandleSetCommHook(v1::CommHookSetRequest request,
                                 SetCommHookCallback done) {
    std::move(done)(absl::UnimplementedError("SetCommHook is not served"));
  }
};

}  // namespace gradd

#endif  // GRADD_SERVER_RPC_NODE_HANDLER_H_
