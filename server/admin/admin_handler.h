// The admin API's logic (rpc/admin_handler.h): status, jobs, one job's
// detail, config, trace and health, each built from snapshots read through
// an AdminSourceInterface. Holds no engine state of its own; the daemon's
// facts (version, start time, config) are fixed at construction.
//
// Bounds: every read of engine state waits at most until the call's
// deadline and at most kMaxWait; health probes the control loop for at most
// kHealthProbe (less when the caller's deadline is nearer), so a hung
// daemon answers NOT_SERVING instead of timing the prober out.
//
// Threads: any; calls are independent.
#ifndef GRADD_SERVER_ADMIN_ADMIN_HANDLER_H_
#define GRADD_SERVER_ADMIN_ADMIN_HANDLER_H_

#include <sys/types.h>

#include <functional>
#include <string>

#include "absl/time/time.h"
#include "gradd/v1/config.pb.h"
#include "server/admin/admin_source.h"
#include "server/rpc/admin_handler.h"

namespace gradd {

struct AdminHandlerOptions {
  std::string version;
  absl::Time start_time = absl::Now();
  // The effective config (defaults applied, resolved at start).
  v1::DaemonConfig config;
  pid_t pid = 0;
  // How the daemon <-> daemon plane is secured (GetStatus.network_security;
  // may be empty). Called on gRPC threads; thread-safe.
  std::function<std::string()> network_security;
  // Where the rendezvous store is and, on etcd, this daemon's lease
  // (GetStatus.rendezvous; admin/rendezvous_view.h). Null: left empty.
  // Called on gRPC threads; thread-safe, never blocks.
  std::function<v1::RendezvousStatus()> rendezvous;
};

class AdminHandler final : public AdminHandlerInterface {
 public:
  static constexpr absl::Duration kMaxWait = absl::Seconds(5);
  static constexpr absl::Duration kHealthProbe = absl::Seconds(2);

  // `source` must outlive the handler.
  AdminHandler(AdminSourceInterface* source, AdminHandlerOptions options)
      : source_(source), options_(std::move(options)) {}

  absl::StatusOr<v1::GetStatusResponse> GetStatus(
      const v1::GetStatusRequest& request, absl::Time deadline) override;
  absl::StatusOr<v1::ListJobsResponse> ListJobs(
      const v1::ListJobsRequest& request, absl::Time deadline) override;
  absl::StatusOr<v1::GetJobResponse> GetJob(const v1::GetJobRequest& request,
                                            absl::Time deadline) override;
  absl::StatusOr<v1::GetConfigResponse> GetConfig(
      const v1::GetConfigRequest& request, absl::Time deadline) override;
  absl::StatusOr<v1::GetTraceResponse> GetTrace(
      const v1::GetTraceRequest& request, absl::Time deadline) override;
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Health(
      const std::string& service, absl::Time deadline) override;

 private:
  // The job `job_id` (INVALID_ARGUMENT when empty, NOT_FOUND when unknown).
  absl::StatusOr<JobSnapshot> OneJob(const std::string& job_id, bool detail,
                                     absl::Time deadline);

  AdminSourceInterface* const source_;
  const AdminHandlerOptions options_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ADMIN_ADMIN_HANDLER_H_
