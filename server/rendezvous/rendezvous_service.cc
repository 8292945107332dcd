#include "server/rendezvous/rendezvous_service.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "server/rendezvous/job_formation.h"
#include "spdlog/spdlog.h"

namespace gradd {

RendezvousService::RendezvousService(KvStore* store, Options options)
    : store_(store), options_(std::move(options)) {}

void RendezvousService::LogRefusal(const std::string& line) {
  const absl::Time now = absl::Now();
  int suppressed = 0;
  {
    absl::MutexLock lock(&log_mu_);
    if (now - last_log_ < absl::Seconds(1)) {
      ++suppressed_;
      return;
    }
    last_log_ = now;
    suppressed = std::exchange(suppressed_, 0);
  }
  if (suppressed > 0) {
    spdlog::warn("{} ({} more refusals in the last second not logged)", line,
                 suppressed);
  } else {
    spdlog::warn("{}", line);
  }
}

absl::Status RendezvousService::Admit(const grpc::ServerContext& context,
                                      absl::string_view method) {
  if (options_.on_request) options_.on_request(method);
  if (options_.credentials == nullptr) return absl::OkStatus();
  absl::Status s = options_.credentials->CheckCall(context);
  if (!s.ok()) LogRefusal(std::string(s.message()));
  return s;
}

absl::Status RendezvousService::CheckFormationKey(
    const grpc::ServerContext& context, absl::string_view job_id,
    absl::string_view key, absl::string_view value) {
  if (options_.expected_node_ids.empty()) return absl::OkStatus();
  std::optional<std::string> node = FormationNodeIdOf(key, value);
  if (!node.has_value()) return absl::OkStatus();
  for (const std::string& id : options_.expected_node_ids) {
    if (id == *node) return absl::OkStatus();
  }
  const std::string shown = absl::CEscape(node->substr(0, 256));
  LogRefusal(absl::StrCat(
      "rendezvous: refused node '", shown, "' (from ", context.peer(),
      ") joining job '", absl::CEscape(job_id.substr(0, 256)),
      "': not in rendezvous.expected_node_ids (",
      absl::StrJoin(options_.expected_node_ids, ", "), ")"));
  return absl::PermissionDeniedError(
      absl::StrCat("node '", shown,
                   "' is not one of the coordinator's "
                   "rendezvous.expected_node_ids (",
                   absl::StrJoin(options_.expected_node_ids, ", "), ")"));
}

absl::Time RendezvousService::BlockingDeadline(
    const grpc::ServerContext* context, int64_t wait_timeout_ms) const {
  const absl::Time now = absl::Now();
  absl::Time deadline = std::min(now + options_.max_blocking_wait,
                                 absl::FromChrono(context->deadline()));
  if (wait_timeout_ms > 0) {
    deadline = std::min(deadline, now + absl::Milliseconds(wait_timeout_ms));
  }
  return deadline;
}

grpc::Status RendezvousService::Set(grpc::ServerContext* context,
                                    const v1::RendezvousSetRequest* request,
                                    v1::RendezvousSetResponse* response) {
  if (absl::Status s = Admit(*context, "Set"); !s.ok()) return ToGrpcStatus(s);
  if (absl::Status s = CheckFormationKey(*context, request->job_id(),
                                         request->key(), request->value());
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ToGrpcStatus(
      store_->Set(request->job_id(), request->key(), request->value()));
}

grpc::Status RendezvousService::Get(grpc::ServerContext* context,
                                    const v1::RendezvousGetRequest* request,
                                    v1::RendezvousGetResponse* response) {
  if (absl::Status s = Admit(*context, "Get"); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<std::string> value =
      store_->GetUntil(request->job_id(), request->key(),
                       BlockingDeadline(context, request->wait_timeout_ms()),
                       [context] { return context->IsCancelled(); });
  if (!value.ok()) return ToGrpcStatus(value.status());
  *response->mutable_value() = *std::move(value);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Add(grpc::ServerContext* context,
                                    const v1::RendezvousAddRequest* request,
                                    v1::RendezvousAddResponse* response) {
  if (absl::Status s = Admit(*context, "Add"); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<int64_t> value =
      store_->Add(request->job_id(), request->key(), request->delta());
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*value);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Wait(grpc::ServerContext* context,
                                     const v1::RendezvousWaitRequest* request,
                                     v1::RendezvousWaitResponse* response) {
  if (absl::Status s = Admit(*context, "Wait"); !s.ok()) return ToGrpcStatus(s);
  const std::vector<std::string> keys(request->keys().begin(),
                                      request->keys().end());
  return ToGrpcStatus(
      store_->WaitUntil(request->job_id(), keys,
                        BlockingDeadline(context, request->wait_timeout_ms()),
                        [context] { return context->IsCancelled(); }));
}

grpc::Status RendezvousService::Delete(
    grpc::ServerContext* context, const v1::RendezvousDeleteRequest* request,
    v1::RendezvousDeleteResponse* response) {
  if (absl::Status s = Admit(*context, "Delete"); !s.ok())
    return ToGrpcStatus(s);
  absl::StatusOr<bool> deleted =
      store_->Delete(request->job_id(), request->key());
  if (!deleted.ok()) return ToGrpcStatus(deleted.status());
  response->set_deleted(*deleted);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Release(
    grpc::ServerContext* context, const v1::RendezvousReleaseRequest* request,
    v1::RendezvousReleaseResponse* response) {
  if (absl::Status s = Admit(*context, "Release"); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<bool> deleted =
      store_->Release(request->job_id(), request->round(), request->node_id(),
                      request->num_nodes());
  if (!deleted.ok()) return ToGrpcStatus(deleted.status());
  response->set_deleted(*deleted);
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(
    const std::string& listen_address) {
  Options options;
  options.listen_address = listen_address;
  return Start(options);
}

absl::StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(
    const Options& options, KvStore* store) {
  const std::string& address = options.listen_address;
  const size_t colon = address.rfind(':');
  int requested_port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(absl::string_view(address).substr(colon + 1),
                        &requested_port) ||
      requested_port < 0 || requested_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous listen address '", address, "' is not host:port"));
  }
  std::unique_ptr<RendezvousServer> server(new RendezvousServer());
  if (store == nullptr) {
    server->owned_store_ = std::make_unique<KvStore>(options.store);
    store = server->owned_store_.get();
  }
  server->store_ = store;
  server->credentials_ = options.credentials;
  server->trimmer_ = std::make_unique<HeapTrimmer>();
  RendezvousService::Options service;
  service.max_blocking_wait = options.max_blocking_wait;
  service.on_request = options.on_request;
  service.credentials = options.credentials;
  service.expected_node_ids = options.expected_node_ids;
  server->service_ =
      std::make_unique<RendezvousService>(store, std::move(service));

  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second daemon on this machine
  // would then bind the same port and the kernel would split connections
  // between two stores. Without it the second bind fails, which is how
  // coordinator discovery (coordinator.h) learns that the port is served.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int bound_port = 0;
  builder.AddListeningPort(address,
                           options.credentials != nullptr
                               ? options.credentials->ServerCredentials()
                               : grpc::InsecureServerCredentials(),
                           &bound_port);
  builder.RegisterService(server->service_.get());
  grpc::ResourceQuota quota("gradd-rendezvous");
  quota.SetMaxThreads(std::max(options.max_threads, 4));
  builder.SetResourceQuota(quota);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(options.store.max_value_bytes + (1 << 20)));
  builder.SetMaxSendMessageSize(
      static_cast<int>(options.store.max_value_bytes + (1 << 20)));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || bound_port == 0) {
    return absl::UnavailableError(
        absl::StrCat("rendezvous service could not listen on '", address, "'"));
  }
  server->port_ = bound_port;
  std::string host = address.substr(0, colon);
  if (host == "0.0.0.0" || host == "[::]" || host == "::" || host.empty()) {
    host = "127.0.0.1";
  }
  server->address_ = absl::StrCat(host, ":", bound_port);
  return server;
}

void RendezvousServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  // Wake blocked waiters first so the server's shutdown does not wait for them.
  store_->Shutdown();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

RendezvousServer::~RendezvousServer() {
  if (server_ != nullptr) Shutdown();
}

}  // namespace gradd
