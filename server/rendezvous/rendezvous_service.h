// RendezvousService: the gRPC adapter of gradd.v1.Rendezvous over a KvStore.
// No logic of its own: it converts requests, the call's deadline and its
// cancellation into KvStore calls and statuses back into gRPC statuses.
//
// Blocking calls run on gRPC's synchronous-server threads, each waits at most
// until min(call deadline, now + max_blocking_wait); KvStore caps how many
// wait at once, and the server caps its threads, so blocked calls cannot
// starve the others. Clients loop on DEADLINE_EXCEEDED until their own
// timeout (RendezvousClient does).
//
// RendezvousServer owns a gRPC server listening on TCP plus the service and
// (unless one is passed in) the store. Start() returns once it listens.
#ifndef GRADD_SERVER_RENDEZVOUS_RENDEZVOUS_SERVICE_H_
#define GRADD_SERVER_RENDEZVOUS_RENDEZVOUS_SERVICE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gradd/v1/rendezvous.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/rendezvous/kv_store.h"

namespace gradd {

class RendezvousService final : public v1::Rendezvous::Service {
 public:
  // Told the method of every request ("Set", "Get", "Add", "Wait",
  // "Delete") on the gRPC thread that serves it (metrics).
  using RequestObserver = std::function<void(absl::string_view method)>;

  // `store` must outlive the service.
  RendezvousService(KvStore* store, absl::Duration max_blocking_wait,
                    RequestObserver on_request = nullptr)
      : store_(store),
        max_blocking_wait_(max_blocking_wait),
        on_request_(std::move(on_request)) {}

  grpc::Status Set(grpc::ServerContext* context,
                   const v1::RendezvousSetRequest* request,
                   v1::RendezvousSetResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context,
                   const v1::RendezvousGetRequest* request,
                   v1::RendezvousGetResponse* response) override;
  grpc::Status Add(grpc::ServerContext* context,
                   const v1::RendezvousAddRequest* request,
                   v1::RendezvousAddResponse* response) override;
  grpc::Status Wait(grpc::ServerContext* context,
                    const v1::RendezvousWaitRequest* request,
                    v1::RendezvousWaitResponse* response) override;
  grpc::Status Delete(grpc::ServerContext* context,
                      const v1::RendezvousDeleteRequest* request,
                      v1::RendezvousDeleteResponse* response) override;

 private:
  absl::Time BlockingDeadline(const grpc::ServerContext* context,
                              int64_t wait_timeout_ms) const;

  void Observe(absl::string_view method) const {
    if (on_request_) on_request_(method);
  }

  KvStore* const store_;
  const absl::Duration max_blocking_wait_;
  const RequestObserver on_request_;
};

class RendezvousServer {
 public:
  struct Options {
    // host:port; port 0 lets the OS choose (see port()).
    std::string listen_address = "0.0.0.0:0";
    // Longest a single Get/Wait call blocks on the server.
    absl::Duration max_blocking_wait = absl::Seconds(30);
    // gRPC server threads at most (blocked waiters included).
    int max_threads = 256;
    KvStore::Options store;
    // Thread-safe; may be empty (RendezvousService::RequestObserver).
    RendezvousService::RequestObserver on_request;
  };

  // Starts serving. With `store` == nullptr the server owns a fresh KvStore;
  // otherwise `store` must outlive the server. Errors: UNAVAILABLE when the
  // address cannot be bound, INVALID_ARGUMENT for a malformed address.
  static absl::StatusOr<std::unique_ptr<RendezvousServer>> Start(
      const Options& options, KvStore* store = nullptr);
  static absl::StatusOr<std::unique_ptr<RendezvousServer>> Start(
      const std::string& listen_address);

  // Stops serving: blocked calls return UNAVAILABLE, in-flight calls get up
  // to `grace` to finish.
  ~RendezvousServer();
  void Shutdown(absl::Duration grace = absl::Seconds(1));

  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  int port() const { return port_; }
  // "127.0.0.1:<port>" when listening on a wildcard host, else host:port.
  const std::string& address() const { return address_; }
  KvStore& store() { return *store_; }

 private:
  RendezvousServer() = default;

  std::unique_ptr<KvStore> owned_store_;
  KvStore* store_ = nullptr;
  std::unique_ptr<RendezvousService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  bool shut_down_ = false;
};

}  // namespace gradd

#endif  // GRADD_SERVER_RENDEZVOUS_RENDEZVOUS_SERVICE_H_
