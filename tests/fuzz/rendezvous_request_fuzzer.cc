// The rendezvous service's requests: a script of Set/Get/Add/Wait/Delete/
// Release requests, each as the bytes a peer daemon would send, parsed as
// the daemon parses them (ParseRequestBytes, proto/grpc_request_traits.h)
// and handed to the real service (server/rendezvous/rendezvous_service.h)
// over a real KvStore with small limits and a fake clock, with expected
// node ids set so that formation keys are checked.
// Properties: no crash, hang or sanitizer report; a request that does not
// parse is INVALID_ARGUMENT naming what; every answer is a canonical status;
// a value that was Set (OK) is what Get returns next.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gradd/v1/rendezvous.pb.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc_request_traits.h"
#include "server/logging.h"
#include "server/rendezvous/kv_store.h"
#include "server/rendezvous/rendezvous_service.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using gradd::fuzz::Input;
namespace v1 = gradd::v1;

// Bounds one input's work (libFuzzer's inputs are at most a few KB anyway).
constexpr int kMaxOps = 64;

void CheckStatus(const grpc::Status& s) {
  const int code = static_cast<int>(s.error_code());
  FUZZ_CHECK(code >= 0 && code <= 16, s.error_message());
  FUZZ_CHECK(s.ok() || s.error_code() != grpc::StatusCode::UNKNOWN,
             s.error_message());
}

// Parses `wire` as the request type; false (after checking the refusal)
// when it does not parse.
template <typename Request>
bool Parse(absl::string_view wire, Request* request) {
  const grpc::Status s = gradd::ParseRequestBytes(wire, request);
  if (s.ok()) return true;
  FUZZ_CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT,
             s.error_message());
  FUZZ_CHECK(!s.error_message().empty(), "a refusal without a message");
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet =
      gradd::InitLogging("off", gradd::LogDestination::kStderr).ok();
  (void)quiet;
  absl::Time now = absl::UnixEpoch() + absl::Hours(24 * 365 * 50);
  gradd::KvStore::Options store_options;
  store_options.max_key_bytes = 256;
  store_options.max_value_bytes = 4096;
  store_options.max_keys_per_job = 32;
  store_options.max_job_bytes = 32 << 10;
  store_options.max_total_bytes = 96 << 10;
  store_options.max_rounds_per_minute = 8;
  store_options.job_ttl = absl::Minutes(10);
  store_options.clock = [&now] { return now; };
  gradd::KvStore store(store_options);
  gradd::RendezvousService::Options service_options;
  // Get/Wait answer at once: a missing key is DEADLINE_EXCEEDED, no wait.
  service_options.max_blocking_wait = absl::ZeroDuration();
  service_options.expected_node_ids = {"node-a", "node-b"};
  gradd::RendezvousService service(&store, service_options);

  Input in(data, size);
  for (int op = 0; op < kMaxOps && !in.empty(); ++op) {
    const uint8_t kind = in.Take<uint8_t>() % 7;
    const std::string wire = in.TakeString(8192);
    grpc::ServerContext context;
    switch (kind) {
      case 0: {
        v1::RendezvousSetRequest request;
        if (!Parse(wire, &request)) break;
        v1::RendezvousSetResponse response;
        const grpc::Status s = service.Set(&context, &request, &response);
        CheckStatus(s);
        if (!s.ok()) break;
        v1::RendezvousGetRequest get;
        get.set_job_id(request.job_id());
        get.set_key(request.key());
        v1::RendezvousGetResponse got;
        grpc::ServerContext get_context;
        const grpc::Status g = service.Get(&get_context, &get, &got);
        FUZZ_CHECK(g.ok(), g.error_message());
        FUZZ_CHECK(got.value() == request.value(), "Get after Set differs");
        break;
      }
      case 1: {
        v1::RendezvousGetRequest request;
        if (!Parse(wire, &request)) break;
        v1::RendezvousGetResponse response;
        CheckStatus(service.Get(&context, &request, &response));
        break;
      }
      case 2: {
        v1::RendezvousAddRequest request;
        if (!Parse(wire, &request)) break;
        v1::RendezvousAddResponse response;
        CheckStatus(service.Add(&context, &request, &response));
        break;
      }
      case 3: {
        v1::RendezvousWaitRequest request;
        if (!Parse(wire, &request)) break;
        v1::RendezvousWaitResponse response;
        CheckStatus(service.Wait(&context, &request, &response));
        break;
      }
      case 4: {
        v1::RendezvousDeleteRequest request;
        if (!Parse(wire, &request)) break;
        v1::RendezvousDeleteResponse response;
        CheckStatus(service.Delete(&context, &request, &response));
        break;
      }
      case 5: {
        v1::RendezvousReleaseRequest request;
        if (!Parse(wire, &request)) break;
        v1::RendezvousReleaseResponse response;
        CheckStatus(service.Release(&context, &request, &response));
        break;
      }
      case 6:
        // Time passes: rate limits reset, idle jobs expire.
        now += absl::Seconds(wire.size() * 7);
        break;
    }
  }
  return 0;
}
