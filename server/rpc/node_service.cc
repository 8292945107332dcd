#include "server/rpc/node_service.h"

#include <chrono>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "server/rpc/request_checks.h"

namespace gradd {
namespace {

// The handler answers by the deadline itself; this margin only keeps a
// wedged handler from holding a gRPC thread forever.
constexpr absl::Duration kHandlerGrace = absl::Seconds(5);
// Detach is immediate; bound it even when the client set no deadline.
constexpr absl::Duration kDetachLimit = absl::Seconds(30);
// The handler gives up this much before the client's own deadline, so the
// trainer reads the daemon's explanation (e.g. which local ranks never
// attached) rather than gRPC's bare "Deadline Exceeded".
constexpr absl::Duration kAnswerMargin = absl::Milliseconds(250);

absl::Time CallDeadline(const grpc::ServerContext* context) {
  const auto deadline = context->deadline();
  const auto now = std::chrono::system_clock::now();
  if (deadline >= now + std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::Now() + absl::FromChrono(deadline - now);
}

// One call's result, shared with the handler's callback: the callback may
// run after this call gave up waiting.
template <typename T>
struct Slot {
  absl::Mutex mu;
  std::optional<T> value ABSL_GUARDED_BY(mu);
};

// Waits for the handler's answer until `deadline`, or until the call is
// cancelled (client gone, server shutting down), which is checked between
// short slices because gRPC offers no wake-up for it in the sync API.
template <typename T>
std::optional<T> WaitFor(grpc::ServerContext* context,
                         const std::shared_ptr<Slot<T>>& slot,
                         absl::Time deadline) {
  absl::MutexLock lock(&slot->mu);
  auto has = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot->mu) {
    return slot->value.has_value();
  };
  while (!slot->mu.AwaitWithDeadline(
      absl::Condition(&has),
      std::min(deadline, absl::Now() + absl::Milliseconds(100)))) {
    if (absl::Now() >= deadline || context->IsCancelled()) break;
  }
  return std::move(slot->value);
}

// A call whose handler waits on other ranks (Attach, RebuildBuckets): the
// handler gets the client's deadline less kAnswerMargin and answers with
// the response. `start(deadline, done)` calls the handler.
template <typename Response, typename Start>
grpc::Status WaitingCall(grpc::ServerContext* context, Response* response,
                         absl::string_view what, Start start) {
  const absl::Time deadline = CallDeadline(context);
  auto slot = std::make_shared<Slot<absl::StatusOr<Response>>>();
  const absl::Time handler_deadline =
      deadline == absl::InfiniteFuture() ? deadline : deadline - kAnswerMargin;
  start(handler_deadline, [slot](absl::StatusOr<Response> result) {
    absl::MutexLock lock(&slot->mu);
    slot->value = std::move(result);
  });
  std::optional<absl::StatusOr<Response>> result =
      WaitFor(context, slot,
              deadline == absl::InfiniteFuture() ? absl::InfiniteFuture()
                                                 : deadline + kHandlerGrace);
  if (!result) {
    return grpc::Status(
        grpc::StatusCode::DEADLINE_EXCEEDED,
        absl::StrCat("gradd did not answer ", what, " in time"));
  }
  if (!result->ok()) return ToGrpcStatus(result->status());
  *response = *std::move(*result);
  return grpc::Status::OK;
}

// An immediate call (Detach, SetCommHook), bounded by kDetachLimit even
// without a client deadline. `start(done)` calls the handler.
template <typename Start>
grpc::Status ImmediateCall(grpc::ServerContext* context, absl::string_view what,
                           Start start) {
  auto slot = std::make_shared<Slot<absl::Status>>();
  start([slot](absl::Status status) {
    absl::MutexLock lock(&slot->mu);
    slot->value = std::move(status);
  });
  std::optional<absl::Status> result =
      WaitFor(context, slot,
              std::min(CallDeadline(context), absl::Now() + kDetachLimit));
  if (!result) {
    return grpc::Status(
        grpc::StatusCode::DEADLINE_EXCEEDED,
        absl::StrCat("gradd did not answer ", what, " in time"));
  }
  return ToGrpcStatus(*result);
}

// INVALID_ARGUMENT naming the field for a client string that breaks the
// rules of common/client_strings.h; checked here so that none reaches the
// engine or its log lines.
grpc::Status CheckStrings(const google::protobuf::Message& request) {
  absl::Status s = CheckRequestStrings(request);
  return s.ok() ? grpc::Status::OK : ToGrpcStatus(s);
}

}  // namespace

grpc::Status NodeService::CheckCaller(const grpc::ServerContext* context,
                                      uint64_t session_id) const {
  if (caller_check_ == nullptr) return grpc::Status::OK;
  absl::Status s = caller_check_->Check(context->peer(), session_id);
  return s.ok() ? grpc::Status::OK : ToGrpcStatus(s);
}

grpc::Status NodeService::Attach(grpc::ServerContext* context,
                                 const v1::AttachRequest* request,
                                 v1::AttachResponse* response) {
  if (grpc::Status s = CheckCaller(context, request->session_id()); !s.ok()) {
    return s;
  }
  if (grpc::Status s = CheckStrings(*request); !s.ok()) return s;
  return WaitingCall(
      context, response, "Attach", [&](absl::Time deadline, auto done) {
        handler_->HandleAttach(*request, deadline, std::move(done));
      });
}

grpc::Status NodeService::Detach(grpc::ServerContext* context,
                                 const v1::DetachRequest* request,
                                 v1::DetachResponse* response) {
  if (grpc::Status s = CheckCaller(context, request->session_id()); !s.ok()) {
    return s;
  }
  if (grpc::Status s = CheckStrings(*request); !s.ok()) return s;
  return ImmediateCall(context, "Detach", [&](auto done) {
    handler_->HandleDetach(*request, std::move(done));
  });
}

grpc::Status NodeService::RebuildBuckets(
    grpc::ServerContext* context, const v1::RebuildBucketsRequest* request,
    v1::RebuildBucketsResponse* response) {
  if (grpc::Status s = CheckCaller(context, request->session_id()); !s.ok()) {
    return s;
  }
  if (grpc::Status s = CheckStrings(*request); !s.ok()) return s;
  return WaitingCall(
      context, response, "RebuildBuckets", [&](absl::Time deadline, auto done) {
        handler_->HandleRebuildBuckets(*request, deadline, std::move(done));
      });
}

grpc::Status NodeService::SetCommHook(grpc::ServerContext* context,
                                      const v1::CommHookSetRequest* request,
                                      v1::CommHookSetResponse* response) {
  if (grpc::Status s = CheckCaller(context, request->session_id()); !s.ok()) {
    return s;
  }
  if (grpc::Status s = CheckStrings(*request); !s.ok()) return s;
  return ImmediateCall(context, "SetCommHook", [&](auto done) {
    handler_->HandleSetCommHook(*request, std::move(done));
  });
}

}  // namespace gradd
