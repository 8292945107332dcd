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
// The edge of the daemon <-> daemon plane: before anything else every call
// is checked against the daemon's NodeCredentials (server/auth/; none: no
// check, for rendezvous.insecure and tests), UNAUTHENTICATED otherwise; and
// when expected node ids are configured, a formation key naming a node not
// among them (job_formation.h, FormationNodeIdOf) is PERMISSION_DENIED.
// Both refusals are logged naming the peer (at most one line a second).
//
// RendezvousServer owns a gRPC server listening on TCP plus the service and
// (unless one is passed in) the store, and a HeapTrimmer so that what
// requests and the store free does not stay in the process (heap_trimmer.h).
// Start() returns once it listens.
#ifndef GRADD_SERVER_RENDEZVOUS_RENDEZVOUS_SERVICE_H_
#define GRADD_SERVER_RENDEZVOUS_RENDEZVOUS_SERVICE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gradd/v1/rendezvous.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/auth/node_credentials.h"
#include "server/rendezvous/heap_trimmer.h"
#include "server/rendezvous/kv_store.h"

namespace gradd {

class RendezvousService final : public v1::Rendezvous::Service {
 public:
  // Told the method of every request ("Set", "Get", "Add", "Wait",
  // "Delete") on the gRPC thread that serves it (metrics).
  using RequestObserver = std::function<void(absl::string_view method)>;

  struct Options {
    // Longest a single Get/Wait call blocks on the server.
    absl::Duration max_blocking_wait = absl::Seconds(30);
    // Thread-safe; may be empty.
    RequestObserver on_request;
    // What every caller must present; null: nothing.
    std::shared_ptr<const NodeCredentials> credentials;
    // The node ids allowed in formations (rendezvous.expected_node_ids);
    // empty: any.
    std::vector<std::string> expected_node_ids;
  };

  // `store` must outlive the service.
  RendezvousService(KvStore* store, Options options);

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
  grpc::Status Release(grpc::ServerContext* context,
                       const v1::RendezvousReleaseRequest* request,
                       v1::RendezvousReleaseResponse* response) override;

 private:
  absl::Time BlockingDeadline(const grpc::ServerContext* context,
                              int64_t wait_timeout_ms) const;
  // Counts the request and checks the caller's credentials.
  absl::Status Admit(const grpc::ServerContext& context,
                     absl::string_view method);
  // PERMISSION_DENIED for a formation key naming an unexpected node.
  absl::Status CheckFormationKey(const grpc::ServerContext& context,
                                 absl::string_view job_id,
                                 absl::string_view key,
                                 absl::string_view value);
  // Logs a refusal, at most one line a second (the rest are counted).
  void LogRefusal(const std::string& line);

  KvStore* const store_;
  const Options options_;
  absl::Mutex log_mu_;
  absl::Time last_log_ ABSL_GUARDED_BY(log_mu_) = absl::InfinitePast();
  int suppressed_ ABSL_GUARDED_BY(log_mu_) = 0;
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
    // TLS for the listener and the check of every call; null: plaintext,
    // no check (the caller decided that: CoordinatorSelector only allows
    // it with rendezvous.insecure). Kept alive as long as the server.
    std::shared_ptr<NodeCredentials> credentials;
    // RendezvousService::Options::expected_node_ids.
    std::vector<std::string> expected_node_ids;
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

  // Before server_: its TLS handshakes call back into the credentials.
  std::shared_ptr<NodeCredentials> credentials_;
  // What the server's requests and the store free goes back to the OS.
  std::unique_ptr<HeapTrimmer> trimmer_;
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
