// Attach validation: the bytes of an AttachRequest as they arrive on the
// daemon's socket, through everything the daemon does with them before its
// engine plans a job:
//   ParseRequestBytes    the gRPC traits (proto/grpc_request_traits.h):
//                        every string field walked for UTF-8, then
//                        protobuf's parse;
//   CheckRequestStrings  the edge's client-string rules
//                        (server/rpc/request_checks.h);
//   ValidateAttachRequest  the engine's checks of ranks, shapes, dtypes,
//                        hooks and memory limits (server/engine/
//                        manager/attach_validation.h), in the replay build
//                        only: the libFuzzer build does not compile the engine
//                        (see tests/fuzz/CMakeLists.txt).
// Properties: no crash and no sanitizer report for any bytes; every refusal
// is INVALID_ARGUMENT (RESOURCE_EXHAUSTED for the engine's limits) with a
// message that is one clean line (no control character, valid UTF-8); a
// request the edge accepts holds only strings that need no escaping in a
// log line.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "common/client_strings.h"
#include "gradd/v1/node.pb.h"
#include "proto/grpc_request_traits.h"
#include "server/rpc/request_checks.h"
#include "tests/fuzz/fuzz_support.h"

#ifdef GRADD_FUZZ_ENGINE
#include "server/config.h"
#include "server/engine/manager/attach_validation.h"
#endif

namespace {

void CheckCleanMessage(absl::string_view message) {
  FUZZ_CHECK(!message.empty(), "an error without a message");
  FUZZ_CHECK(!gradd::NeedsEscapeForLog(message), gradd::EscapeForLog(message));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using gradd::NeedsEscapeForLog;
  gradd::v1::AttachRequest request;
  const grpc::Status parsed = gradd::ParseRequestBytes(
      absl::string_view(reinterpret_cast<const char*>(data), size), &request);
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.error_code() == grpc::StatusCode::INVALID_ARGUMENT,
               parsed.error_message());
    CheckCleanMessage(parsed.error_message());
    return 0;
  }
  FUZZ_CHECK(
      gradd::FindInvalidUtf8(request.job_id()) == absl::string_view::npos,
      "a parsed job id that is not UTF-8");

  const absl::Status checked = gradd::CheckRequestStrings(request);
  if (!checked.ok()) {
    FUZZ_CHECK(checked.code() == absl::StatusCode::kInvalidArgument,
               checked.ToString());
    CheckCleanMessage(checked.message());
    return 0;
  }
  FUZZ_CHECK(!NeedsEscapeForLog(request.job_id()), request.job_id());
  FUZZ_CHECK(!NeedsEscapeForLog(request.node_id()), request.node_id());
  FUZZ_CHECK(!NeedsEscapeForLog(request.coordinator()), request.coordinator());
  FUZZ_CHECK(!NeedsEscapeForLog(request.comm_hook().name()),
             request.comm_hook().name());
  for (const gradd::v1::ParamSpec& p : request.params()) {
    FUZZ_CHECK(!NeedsEscapeForLog(p.name()), p.name());
    FUZZ_CHECK(p.name().size() <= gradd::kMaxParamNameBytes, "long name");
  }

#ifdef GRADD_FUZZ_ENGINE
  static const gradd::v1::DaemonConfig config = gradd::DefaultConfig();
  const auto params = gradd::ValidateAttachRequest(request, config);
  if (!params.ok()) {
    FUZZ_CHECK(
        params.status().code() == absl::StatusCode::kInvalidArgument ||
            params.status().code() == absl::StatusCode::kResourceExhausted,
        params.status().ToString());
    CheckCleanMessage(params.status().message());
  } else {
    FUZZ_CHECK(params->size() == static_cast<size_t>(request.params_size()),
               "a parameter lost");
  }
#endif
  return 0;
}
