// gRPC adapter for gradd.v1.Node: forwards each call to a
// NodeHandlerInterface and answers with the handler's result. No job logic
// runs here.
//
// Threads: every method is a gRPC callback method, so a call holds no
// thread while its handler works: an Attach that waits for the job's other
// ranks, or a RebuildBuckets that waits for the other ranks' orders, is a
// reactor (a few hundred bytes) until the handler's callback finishes it,
// from the handler's own thread. Thousands of pending attaches leave the
// daemon with its usual threads (issue 20, point 5).
//
// Each call's reactor lives until gRPC's OnDone; the handler's callback may
// come later (the client went away first) and then finds the call already
// answered and does nothing. A client that gives up on a pending Attach
// (cancel, deadline, closed connection) is answered CANCELLED at once, and
// the handler is told to drop the rank (HandleAttachCancelled).
//
// Answers: the handler's status and message unchanged; DEADLINE_EXCEEDED
// "gradd did not answer <call> in time" when an immediate call (Detach,
// SetCommHook) gets no answer within its deadline, 30 s at most.
#ifndef GRADD_SERVER_RPC_NODE_SERVICE_H_
#define GRADD_SERVER_RPC_NODE_SERVICE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "gradd/v1/node.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/rpc/caller_check.h"
#include "server/rpc/node_handler.h"

namespace gradd {

class NodeService final : public v1::Node::CallbackService {
 public:
  // `handler` (and `caller_check`, which may be null: no check) must
  // outlive the service.
  explicit NodeService(NodeHandlerInterface* handler,
                       const CallerCheckInterface* caller_check = nullptr)
      : handler_(handler), caller_check_(caller_check) {}

  grpc::ServerUnaryReactor* Attach(grpc::CallbackServerContext* context,
                                   const v1::AttachRequest* request,
                                   v1::AttachResponse* response) override;
  grpc::ServerUnaryReactor* Detach(grpc::CallbackServerContext* context,
                                   const v1::DetachRequest* request,
                                   v1::DetachResponse* response) override;
  grpc::ServerUnaryReactor* RebuildBuckets(
      grpc::CallbackServerContext* context,
      const v1::RebuildBucketsRequest* request,
      v1::RebuildBucketsResponse* response) override;
  grpc::ServerUnaryReactor* SetCommHook(
      grpc::CallbackServerContext* context,
      const v1::CommHookSetRequest* request,
      v1::CommHookSetResponse* response) override;

 private:
  // PERMISSION_DENIED (as a gRPC status) unless the caller owns the session.
  grpc::Status CheckCaller(const grpc::CallbackServerContext* context,
                           uint64_t session_id) const;

  NodeHandlerInterface* const handler_;
  const CallerCheckInterface* const caller_check_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_RPC_NODE_SERVICE_H_
