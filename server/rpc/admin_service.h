// gRPC adapters for gradd.v1.Admin and grpc.health.v1.Health: each call is
// forwarded to an AdminHandlerInterface with the call's deadline, and its
// status translated. No logic runs here.
//
// Threads: gRPC's sync-server threads. A call blocks its thread at most
// until its deadline (the handler's own bounds are shorter). A Health.Watch
// stream holds its thread until the client ends it or the server shuts
// down, re-probing every kWatchInterval and sending each change.
#ifndef GRADD_SERVER_RPC_ADMIN_SERVICE_H_
#define GRADD_SERVER_RPC_ADMIN_SERVICE_H_

#include "absl/time/time.h"
#include "gradd/v1/admin.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/rpc/admin_handler.h"

namespace gradd {

class AdminService final : public v1::Admin::Service {
 public:
  // `handler` must outlive the service.
  explicit AdminService(AdminHandlerInterface* handler) : handler_(handler) {}

  grpc::Status GetStatus(grpc::ServerContext* context,
                         const v1::GetStatusRequest* request,
                         v1::GetStatusResponse* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context,
                        const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext* context,
                      const v1::GetJobRequest* request,
                      v1::GetJobResponse* response) override;
  grpc::Status GetConfig(grpc::ServerContext* context,
                         const v1::GetConfigRequest* request,
                         v1::GetConfigResponse* response) override;
  grpc::Status GetTrace(grpc::ServerContext* context,
                        const v1::GetTraceRequest* request,
                        v1::GetTraceResponse* response) override;

 private:
  AdminHandlerInterface* const handler_;
};

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  static constexpr absl::Duration kWatchInterval = absl::Seconds(1);

  // `handler` must outlive the service.
  explicit HealthService(AdminHandlerInterface* handler) : handler_(handler) {}

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;
  grpc::Status Watch(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>*
                         writer) override;

 private:
  AdminHandlerInterface* const handler_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_RPC_ADMIN_SERVICE_H_
