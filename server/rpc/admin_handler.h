// The handler the gRPC Admin and Health services forward to
// (rpc/admin_service.h). Implemented by server/admin/AdminHandler; tests
// call it directly.
//
// Every call answers by `deadline` at the latest: the handler reads the
// engine's state through bounded snapshots (admin/admin_source.h), never by
// holding the engine's locks, so a call may run on any thread.
#ifndef GRADD_SERVER_RPC_ADMIN_HANDLER_H_
#define GRADD_SERVER_RPC_ADMIN_HANDLER_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradd/v1/admin.pb.h"
#include "grpc/health/v1/health.pb.h"

namespace gradd {

class AdminHandlerInterface {
 public:
  virtual ~AdminHandlerInterface() = default;

  // Thread-safe.
  virtual absl::StatusOr<v1::GetStatusResponse> GetStatus(
      const v1::GetStatusRequest& request, absl::Time deadline) = 0;
  virtual absl::StatusOr<v1::ListJobsResponse> ListJobs(
      const v1::ListJobsRequest& request, absl::Time deadline) = 0;
  virtual absl::StatusOr<v1::GetJobResponse> GetJob(
      const v1::GetJobRequest& request, absl::Time deadline) = 0;
  virtual absl::StatusOr<v1::GetConfigResponse> GetConfig(
      const v1::GetConfigRequest& request, absl::Time deadline) = 0;
  virtual absl::StatusOr<v1::GetTraceResponse> GetTrace(
      const v1::GetTraceRequest& request, absl::Time deadline) = 0;
  // grpc.health.v1 Check for `service` ("" = the daemon): SERVING or
  // NOT_SERVING, answered before `deadline`; NOT_FOUND for a service the
  // daemon does not serve.
  virtual absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus>
  Health(const std::string& service, absl::Time deadline) = 0;
};

}  // namespace gradd

#endif  // GRADD_SERVER_RPC_ADMIN_HANDLER_H_
