#include "server/rendezvous/rendezvous_service.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace gradd {

absl::Time RendezvousService::BlockingDeadline(
    const grpc::ServerContext* context, int64_t wait_timeout_ms) const {
  const absl::Time now = absl::Now();
  absl::Time deadline =
      std::min(now + max_blocking_wait_, absl::FromChrono(context->deadline()));
  if (wait_timeout_ms > 0) {
    deadline = std::min(deadline, now + absl::Milliseconds(wait_timeout_ms));
  }
  return deadline;
}

grpc::Status RendezvousService::Set(grpc::ServerContext* context,
                                    const v1::RendezvousSetRequest* request,
                                    v1::RendezvousSetResponse* response) {
  Observe("Set");
  return ToGrpcStatus(
      store_->Set(request->job_id(), request->key(), request->value()));
}

grpc::Status RendezvousService::Get(grpc::ServerContext* context,
                                    const v1::RendezvousGetRequest* request,
                                    v1::RendezvousGetResponse* response) {
  Observe("Get");
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
  Observe("Add");
  absl::StatusOr<int64_t> value =
      store_->Add(request->job_id(), request->key(), request->delta());
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*value);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Wait(grpc::ServerContext* context,
                                     const v1::RendezvousWaitRequest* request,
                                     v1::RendezvousWaitResponse* response) {
  Observe("Wait");
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
  Observe("Delete");
  absl::StatusOr<bool> deleted =
      store_->Delete(request->job_id(), request->key());
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
  server->service_ = std::make_unique<RendezvousService>(
      store, options.max_blocking_wait, options.on_request);

  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second daemon on this machine
  // would then bind the same port and the kernel would split connections
  // between two stores. Without it the second bind fails, which is how
  // coordinator discovery (coordinator.h) learns that the port is served.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int bound_port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(),
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
