#include "server/rpc/node_service.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "grpcpp/alarm.h"
#include "proto/grpc_request_traits.h"
#include "server/rpc/request_checks.h"

namespace gradd {
namespace {

// Detach is immediate; bound it even when the client set no deadline.
constexpr absl::Duration kDetachLimit = absl::Seconds(30);
// The handler gives up this much before the client's own deadline, so the
// trainer reads the daemon's explanation (e.g. which local ranks never
// attached) rather than gRPC's bare "Deadline Exceeded".
constexpr absl::Duration kAnswerMargin = absl::Milliseconds(250);

absl::Time CallDeadline(const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  const auto now = std::chrono::system_clock::now();
  if (deadline >= now + std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::Now() + absl::FromChrono(deadline - now);
}

// The one answer of a call: the first of the handler's callback, the
// client's cancellation and the immediate calls' timer gives it; the others
// find it given and do nothing. Shared by the reactor and the callbacks,
// which may outlive the reactor (a handler answering after the client went
// away).
class Answer {
 public:
  explicit Answer(grpc::ServerUnaryReactor* reactor) : reactor_(reactor) {}

  // Unless the call is answered already: `fill()` writes the response and
  // returns the status, and the call finishes with it. True if this was
  // the answer.
  template <typename Fill>
  bool Give(Fill fill) {
    {
      absl::MutexLock lock(&mu_);
      if (answered_) return false;
      answered_ = true;
    }
    // gRPC runs OnDone (which deletes the reactor and the response) only
    // after Finish, and this is the call's only Finish: both are alive.
    grpc::Status status = fill();
    reactor_->Finish(std::move(status));
    return true;
  }

 private:
  absl::Mutex mu_;
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ServerUnaryReactor* const reactor_;
};

// A unary call's reactor: lives from the method until gRPC's OnDone.
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  UnaryCall() : answer_(std::make_shared<Answer>(this)) {}

  const std::shared_ptr<Answer>& answer() const { return answer_; }

  // Answers `status` now.
  void Reply(grpc::Status status) {
    answer_->Give([&] { return std::move(status); });
  }

  // Run (on a gRPC thread) when the client gives up before the answer.
  // Set before the method returns the reactor.
  void OnCancelled(absl::AnyInvocable<void() &&> f) {
    on_cancelled_ = std::move(f);
  }

  // Answers DEADLINE_EXCEEDED naming `what` at `when` unless answered by
  // then. A gRPC timer: no thread waits for it.
  void AnswerBy(absl::Time when, absl::string_view what) {
    if (when == absl::InfiniteFuture()) return;
    alarm_ = std::make_unique<grpc::Alarm>();
    alarm_->Set(absl::ToChronoTime(when),
                [answer = answer_, what = std::string(what)](bool fired) {
                  if (!fired) return;  // cancelled: the call is done
                  answer->Give([&] {
                    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                        absl::StrCat("gradd did not answer ",
                                                     what, " in time"));
                  });
                });
  }

  void OnCancel() override {
    const bool first = answer_->Give([] {
      return grpc::Status(grpc::StatusCode::CANCELLED,
                          "the client gave up on the call");
    });
    if (first && on_cancelled_ != nullptr) std::move(on_cancelled_)();
  }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<Answer> answer_;
  absl::AnyInvocable<void() &&> on_cancelled_;
  // Destroyed with the call, which cancels it.
  std::unique_ptr<grpc::Alarm> alarm_;
};

// The handler's end of a call. A handler that drops its callback without
// calling it (the engine stopping: engine/manager/job_manager.h) answers
// UNAVAILABLE here, rather than leaving the call to the client's deadline.
class Responder {
 public:
  Responder(std::shared_ptr<Answer> answer, absl::string_view what)
      : answer_(std::move(answer)), what_(what) {}
  Responder(Responder&& other) noexcept
      : answer_(std::move(other.answer_)), what_(other.what_) {}
  Responder& operator=(Responder&&) = delete;
  ~Responder() {
    if (answer_ == nullptr) return;
    answer_->Give([&] {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("gradd did not answer ", what_,
                                       ": the daemon is stopping"));
    });
  }

  template <typename Fill>
  void Give(Fill fill) {
    std::shared_ptr<Answer> answer = std::move(answer_);
    answer->Give(std::move(fill));
  }

 private:
  std::shared_ptr<Answer> answer_;
  absl::string_view what_;  // a literal
};

// Writes `message` as the call's response.
grpc::Status Serialize(const google::protobuf::MessageLite& message,
                       grpc::ByteBuffer* response) {
  bool own_buffer = false;
  return grpc::GenericSerialize<grpc::ProtoBufferWriter,
                                google::protobuf::MessageLite>(
      message, response, &own_buffer);
}

// Parses the request as gRPC's sync server did (proto/grpc_request_traits.h:
// INVALID_ARGUMENT naming a string field that is not UTF-8); the callback
// server would answer a parse failure with a bare UNIMPLEMENTED.
grpc::Status Parse(const grpc::ByteBuffer& raw,
                   google::protobuf::Message* request) {
  grpc::ByteBuffer copy(raw);  // shares the slices; parsing clears it
  return ParseMessage(&copy, request);
}

// A call whose handler waits on other ranks (Attach, RebuildBuckets): the
// handler gets the client's deadline less kAnswerMargin and answers with
// the response. The client's deadline itself cancels the call (OnCancel),
// so no timer of ours is needed. `start(deadline, done)` calls the handler.
template <typename Response, typename Start>
void StartWaiting(UnaryCall* call, const grpc::CallbackServerContext* context,
                  grpc::ByteBuffer* response, absl::string_view what,
                  Start start) {
  const absl::Time deadline = CallDeadline(context);
  const absl::Time handler_deadline =
      deadline == absl::InfiniteFuture() ? deadline : deadline - kAnswerMargin;
  start(handler_deadline, [responder = Responder(call->answer(), what),
                           response](absl::StatusOr<Response> result) mutable {
    responder.Give([&] {
      if (!result.ok()) return ToGrpcStatus(result.status());
      return Serialize(*result, response);
    });
  });
}

// An immediate call (Detach, SetCommHook) answering an empty `Response`,
// bounded by kDetachLimit even without a client deadline. `start(done)`
// calls the handler.
template <typename Response, typename Start>
void StartImmediate(UnaryCall* call, const grpc::CallbackServerContext* context,
                    grpc::ByteBuffer* response, absl::string_view what,
                    Start start) {
  call->AnswerBy(std::min(CallDeadline(context), absl::Now() + kDetachLimit),
                 what);
  start([responder = Responder(call->answer(), what),
         response](absl::Status status) mutable {
    responder.Give([&] {
      if (!status.ok()) return ToGrpcStatus(status);
      return Serialize(Response(), response);
    });
  });
}

// INVALID_ARGUMENT naming the field for a client string that breaks the
// rules of common/client_strings.h; checked here so that none reaches the
// engine or its log lines.
grpc::Status CheckStrings(const google::protobuf::Message& request) {
  absl::Status s = CheckRequestStrings(request);
  return s.ok() ? grpc::Status::OK : ToGrpcStatus(s);
}

}  // namespace

grpc::Status NodeService::CheckCaller(
    const grpc::CallbackServerContext* context, uint64_t session_id) const {
  if (caller_check_ == nullptr) return grpc::Status::OK;
  absl::Status s = caller_check_->Check(context->peer(), session_id);
  return s.ok() ? grpc::Status::OK : ToGrpcStatus(s);
}

// The checks every call makes before the handler sees it, in the order
// the sync service made them: the request parses, the caller owns the
// session, the strings follow the rules. The first failure, or OK.
grpc::Status NodeService::Admit(
    const grpc::CallbackServerContext* context, const grpc::ByteBuffer& raw,
    google::protobuf::Message* request,
    uint64_t (*session_of)(const google::protobuf::Message&)) const {
  if (grpc::Status s = Parse(raw, request); !s.ok()) return s;
  if (grpc::Status s = CheckCaller(context, session_of(*request)); !s.ok()) {
    return s;
  }
  return CheckStrings(*request);
}

namespace {

template <typename Request>
uint64_t SessionOf(const google::protobuf::Message& request) {
  return static_cast<const Request&>(request).session_id();
}

}  // namespace

grpc::ServerUnaryReactor* NodeService::Attach(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* response) {
  auto* call = new UnaryCall();
  v1::AttachRequest request;
  if (grpc::Status s =
          Admit(context, *raw, &request, &SessionOf<v1::AttachRequest>);
      !s.ok()) {
    call->Reply(std::move(s));
    return call;
  }
  // The session has at most this one Attach pending (the handler refuses
  // a second), so its id names it.
  call->OnCancelled([handler = handler_, session = request.session_id()] {
    handler->HandleAttachCancelled(session);
  });
  StartWaiting<v1::AttachResponse>(
      call, context, response, "Attach", [&](absl::Time deadline, auto done) {
        handler_->HandleAttach(std::move(request), deadline, std::move(done));
      });
  return call;
}

grpc::ServerUnaryReactor* NodeService::Detach(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* response) {
  auto* call = new UnaryCall();
  v1::DetachRequest request;
  if (grpc::Status s =
          Admit(context, *raw, &request, &SessionOf<v1::DetachRequest>);
      !s.ok()) {
    call->Reply(std::move(s));
    return call;
  }
  StartImmediate<v1::DetachResponse>(
      call, context, response, "Detach", [&](auto done) {
        handler_->HandleDetach(std::move(request), std::move(done));
      });
  return call;
}

grpc::ServerUnaryReactor* NodeService::RebuildBuckets(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* response) {
  auto* call = new UnaryCall();
  v1::RebuildBucketsRequest request;
  if (grpc::Status s =
          Admit(context, *raw, &request, &SessionOf<v1::RebuildBucketsRequest>);
      !s.ok()) {
    call->Reply(std::move(s));
    return call;
  }
  // A cancelled rebuild is left to the job: it answers by the deadline
  // (engine/job/rebuild.h), and the answer then finds the call done.
  StartWaiting<v1::RebuildBucketsResponse>(
      call, context, response, "RebuildBuckets",
      [&](absl::Time deadline, auto done) {
        handler_->HandleRebuildBuckets(std::move(request), deadline,
                                       std::move(done));
      });
  return call;
}

grpc::ServerUnaryReactor* NodeService::SetCommHook(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* response) {
  auto* call = new UnaryCall();
  v1::CommHookSetRequest request;
  if (grpc::Status s =
          Admit(context, *raw, &request, &SessionOf<v1::CommHookSetRequest>);
      !s.ok()) {
    call->Reply(std::move(s));
    return call;
  }
  StartImmediate<v1::CommHookSetResponse>(
      call, context, response, "SetCommHook", [&](auto done) {
        handler_->HandleSetCommHook(std::move(request), std::move(done));
      });
  return call;
}

}  // namespace gradd
