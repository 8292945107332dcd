// The daemon's edge check of every string a client sends: each string field
// of a request, at any depth (job ids, parameter names, node ids, the
// coordinator address, hook names, health service names), must follow the
// client-string rules of common/client_strings.h within its field's limit.
// The gRPC adapters (node_service.cc, admin_service.cc) call it before
// anything is forwarded, so no such string reaches the engine, a log line or
// a metric label. (Strings that are not UTF-8 do not even parse: see
// proto/grpc_request_traits.h.)
//
// Reflection over the request, so a string field added later is checked
// too (with kDefaultClientStringBytes unless it gets a limit here). `bytes`
// fields (GPU UUIDs) are binary and not checked.
//
// Pure; thread-safe. Errors: INVALID_ARGUMENT naming the field by its path
// from the request, e.g. "AttachRequest.params[3].name".
#ifndef GRADD_SERVER_RPC_REQUEST_CHECKS_H_
#define GRADD_SERVER_RPC_REQUEST_CHECKS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace gradd {

// The limit of a string field no rule below names.
inline constexpr size_t kDefaultClientStringBytes = 4096;

absl::Status CheckRequestStrings(const google::protobuf::Message& request);

}  // namespace gradd

#endif  // GRADD_SERVER_RPC_REQUEST_CHECKS_H_
