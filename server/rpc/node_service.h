// gRPC adapter for gradd.v1.Node: forwards each call to a
// NodeHandlerInterface and waits for its answer, bounded by the call's
// deadline. No job logic runs here.
//
// Threads: gRPC's sync-server threads. Each call blocks its thread while the
// handler works (an Attach waits for the job's other ranks), so the server's
// thread limit bounds concurrent attaches; see Daemon.
#ifndef GRADD_SERVER_RPC_NODE_SERVICE_H_
#define GRADD_SERVER_RPC_NODE_SERVICE_H_

#include "absl/status/status.h"
#include "gradd/v1/node.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/rpc/caller_check.h"
#include "server/rpc/node_handler.h"

namespace gradd {

class NodeService final : public v1::Node::Service {
 public:
  // `handler` (and `caller_check`, which may be null: no check) must
  // outlive the service.
  explicit NodeService(NodeHandlerInterface* handler,
                       const CallerCheckInterface* caller_check = nullptr)
      : handler_(handler), caller_check_(caller_check) {}

  grpc::Status Attach(grpc::ServerContext* context,
                      const v1::AttachRequest* request,
                      v1::AttachResponse* response) override;
  grpc::Status Detach(grpc::ServerContext* context,
                      const v1::DetachRequest* request,
                      v1::DetachResponse* response) override;
  grpc::Status RebuildBuckets(grpc::ServerContext* context,
                              const v1::RebuildBucketsRequest* request,
                              v1::RebuildBucketsResponse* response) override;
  grpc::Status SetCommHook(grpc::ServerContext* context,
                           const v1::CommHookSetRequest* request,
                           v1::CommHookSetResponse* response) override;

 private:
  // PERMISSION_DENIED (as a gRPC status) unless the caller owns the session.
  grpc::Status CheckCaller(const grpc::ServerContext* context,
                           uint64_t session_id) const;

  NodeHandlerInterface* const handler_;
  const CallerCheckInterface* const caller_check_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_RPC_NODE_SERVICE_H_
