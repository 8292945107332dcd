#include "server/rpc/admin_service.h"

#include <chrono>

#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "server/rpc/request_checks.h"

namespace gradd {
namespace {

using grpc::health::v1::HealthCheckResponse;

absl::Time CallDeadline(const grpc::ServerContext* context) {
  const auto deadline = context->deadline();
  const auto now = std::chrono::system_clock::now();
  if (deadline >= now + std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::Now() + absl::FromChrono(deadline - now);
}

// INVALID_ARGUMENT naming the field for a client string that breaks the
// rules of common/client_strings.h (a job id asked for, a health service
// name).
grpc::Status CheckStrings(const google::protobuf::Message& request) {
  absl::Status s = CheckRequestStrings(request);
  return s.ok() ? grpc::Status::OK : ToGrpcStatus(s);
}

template <typename Response>
grpc::Status Answer(absl::StatusOr<Response> result, Response* response) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status AdminService::GetStatus(grpc::ServerContext* context,
                                     const v1::GetStatusRequest* request,
                                     v1::GetStatusResponse* response) {
  return Answer(handler_->GetStatus(*request, CallDeadline(context)), response);
}

grpc::Status AdminService::ListJobs(grpc::ServerContext* context,
                                    const v1::ListJobsRequest* request,
                                    v1::ListJobsResponse* response) {
  return Answer(handler_->ListJobs(*request, CallDeadline(context)), response);
}

grpc::Status AdminService::GetJob(grpc::ServerContext* context,
                                  const v1::GetJobRequest* request,
                                  v1::GetJobResponse* response) {
  if (grpc::Status s = CheckStrings(*request); !s.ok()) return s;
  return Answer(handler_->GetJob(*request, CallDeadline(context)), response);
}

grpc::Status AdminService::GetConfig(grpc::ServerContext* context,
                                     const v1::GetConfigRequest* request,
                                     v1::GetConfigResponse* response) {
  return Answer(handler_->GetConfig(*request, CallDeadline(context)), response);
}

grpc::Status AdminService::GetTrace(grpc::ServerContext* context,
                                    const v1::GetTraceRequest* request,
                                    v1::GetTraceResponse* response) {
  if (grpc::Status s = CheckStrings(*request); !s.ok()) return s;
  return Answer(handler_->GetTrace(*request, CallDeadline(context)), response);
}

grpc::Status HealthService::Check(
    grpc::ServerContext* context,
    const grpc::health::v1::HealthCheckRequest* request,
    HealthCheckResponse* response) {
  if (grpc::Status s = CheckStrings(*request); !s.ok()) return s;
  absl::StatusOr<HealthCheckResponse::ServingStatus> status =
      handler_->Health(request->service(), CallDeadline(context));
  if (!status.ok()) return ToGrpcStatus(status.status());
  response->set_status(*status);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(
    grpc::ServerContext* context,
    const grpc::health::v1::HealthCheckRequest* request,
    grpc::ServerWriter<HealthCheckResponse>* writer) {
  if (grpc::Status s = CheckStrings(*request); !s.ok()) return s;
  bool first = true;
  HealthCheckResponse::ServingStatus last = HealthCheckResponse::UNKNOWN;
  while (!context->IsCancelled()) {
    absl::StatusOr<HealthCheckResponse::ServingStatus> status =
        handler_->Health(request->service(), absl::Now() + kWatchInterval);
    const HealthCheckResponse::ServingStatus now =
        status.ok() ? *status : HealthCheckResponse::SERVICE_UNKNOWN;
    if (first || now != last) {
      HealthCheckResponse response;
      response.set_status(now);
      if (!writer->Write(response)) break;  // the client is gone
      first = false;
      last = now;
    }
    // The sync API has no wake-up on cancellation: re-check in slices.
    const absl::Time next = absl::Now() + kWatchInterval;
    while (!context->IsCancelled() && absl::Now() < next) {
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  return grpc::Status::OK;
}

}  // namespace gradd
