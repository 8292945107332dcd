#include "server/rpc/node_service.h"

#include <chrono>
#include <memory>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"

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
  const absl::Time deadline = CallDeadline(context);
  auto slot = std::make_shared<Slot<absl::StatusOr<v1::AttachResponse>>>();
  const absl::Time handler_deadline =
      deadline == absl::InfiniteFuture() ? deadline : deadline - kAnswerMargin;
  handler_->HandleAttach(*request, handler_deadline,
                         [slot](absl::StatusOr<v1::AttachResponse> result) {
                           absl::MutexLock lock(&slot->mu);
                           slot->value = std::move(result);
                         });
  std::optional<absl::StatusOr<v1::AttachResponse>> result =
      WaitFor(context, slot,
              deadline == absl::InfiniteFuture() ? absl::InfiniteFuture()
                                                 : deadline + kHandlerGrace);
  if (!result) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        "gradd did not answer Attach in time");
  }
  if (!result->ok()) return ToGrpcStatus(result->status());
  *response = *std::move(*result);
  return grpc::Status::OK;
}

grpc::Status NodeService::Detach(grpc::ServerContext* context,
                                 const v1::DetachRequest* request,
                                 v1::DetachResponse* response) {
  if (grpc::Status s = CheckCaller(context, request->session_id()); !s.ok()) {
    return s;
  }
  auto slot = std::make_shared<Slot<absl::Status>>();
  handler_->HandleDetach(*request, [slot](absl::Status status) {
    absl::MutexLock lock(&slot->mu);
    slot->value = std::move(status);
  });
  std::optional<absl::Status> result =
      WaitFor(context, slot,
              std::min(CallDeadline(context), absl::Now() + kDetachLimit));
  if (!result) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        "gradd did not answer Detach in time");
  }
  return ToGrpcStatus(*result);
}

grpc::Status NodeService::RebuildBuckets(
    grpc::ServerContext* context, const v1::RebuildBucketsRequest* request,
    v1::RebuildBucketsResponse* response) {
  if (grpc::Status s = CheckCaller(context, request->session_id()); !s.ok()) {
    return s;
  }
  const absl::Time deadline = CallDeadline(context);
  auto slot =
      std::make_shared<Slot<absl::StatusOr<v1::RebuildBucketsResponse>>>();
  const absl::Time handler_deadline =
      deadline == absl::InfiniteFuture() ? deadline : deadline - kAnswerMargin;
  handler_->HandleRebuildBuckets(
      *request, handler_deadline,
      [slot](absl::StatusOr<v1::RebuildBucketsResponse> result) {
        absl::MutexLock lock(&slot->mu);
        slot->value = std::move(result);
      });
  std::optional<absl::StatusOr<v1::RebuildBucketsResponse>> result =
      WaitFor(context, slot,
              deadline == absl::InfiniteFuture() ? absl::InfiniteFuture()
                                                 : deadline + kHandlerGrace);
  if (!result) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        "gradd did not answer RebuildBuckets in time");
  }
  if (!result->ok()) return ToGrpcStatus(result->status());
  *response = *std::move(*result);
  return grpc::Status::OK;
}

grpc::Status NodeService::SetCommHook(grpc::ServerContext* context,
                                      const v1::CommHookSetRequest* request,
                                      v1::CommHookSetResponse* response) {
  if (grpc::Status s = CheckCaller(context, request->session_id()); !s.ok()) {
    return s;
  }
  auto slot = std::make_shared<Slot<absl::Status>>();
  handler_->HandleSetCommHook(*request, [slot](absl::Status status) {
    absl::MutexLock lock(&slot->mu);
    slot->value = std::move(status);
  });
  std::optional<absl::Status> result =
      WaitFor(context, slot,
              std::min(CallDeadline(context), absl::Now() + kDetachLimit));
  if (!result) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        "gradd did not answer SetCommHook in time");
  }
  return ToGrpcStatus(*result);
}

}  // namespace gradd
