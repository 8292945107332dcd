// absl::Status <-> grpc::Status: the one place gradd converts between them.
// gRPC and absl share the canonical code numbers, so the code carries over
// unchanged and the message travels as the gRPC error message. Header-only so
// that gradd_common itself does not depend on gRPC; include it only from
// targets that link gRPC.
#ifndef GRADD_COMMON_GRPC_STATUS_H_
#define GRADD_COMMON_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace gradd {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace gradd

#endif  // GRADD_COMMON_GRPC_STATUS_H_
