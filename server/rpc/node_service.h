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

// Raw callback methods: the service parses each request itself, so a
// request that does not parse is answered as the sync service answered it
// (proto/grpc_request_traits.h) and not with gRPC's bare UNIMPLEMENTED.
using NodeCallbackBase = v1::Node::WithRawCallbackMethod_Attach<
    v1::Node::WithRawCallbackMethod_Detach<
        v1::Node::WithRawCallbackMethod_RebuildBuckets<
            v1::Node::WithRawCallbackMethod_SetCommHook<v1::Node::Service>>>>;

class NodeService final : public NodeCallbackBase {
 public:
  // `handler` (and `caller_check`, which may be null: no check) must
  // outlive the service.
  explicit NodeService(NodeHandlerInterface* handler,
                       const CallerCheckInterface* caller_check = nullptr)
      : handler_(handler), caller_check_(caller_check) {}

  // Each request is a serialized gradd.v1 request of the method's type
  // (node.proto); each answer a serialized response.
  grpc::ServerUnaryReactor* Attach(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Detach(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* RebuildBuckets(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* SetCommHook(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;

 private:
  // PERMISSION_DENIED (as a gRPC status) unless the caller owns the session.
  grpc::Status CheckCaller(const grpc::CallbackServerContext* context,
                           uint64_t session_id) const;
  // Parses `raw` into `request` and checks it (caller, strings); the first
  // failure or OK.
  grpc::Status Admit(
      const grpc::CallbackServerContext* context, const grpc::ByteBuffer& raw,
      google::protobuf::Message* request,
      uint64_t (*session_of)(const google::protobuf::Message&)) const;

  NodeHandlerInterface* const handler_;
  const CallerCheckInterface* const caller_check_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_RPC_NODE_SERVICE_H_
