// Coordinator discovery: which daemon serves a multi-node job's rendezvous
// store, and where the others find it, with no per-node configuration.
//
// The rule, in order (the first that applies wins):
//   1. rendezvous.coordinator_address configured: always that.
//   2. rendezvous.listen_address configured: this daemon serves the store
//      from start-up and is every job's coordinator unless 1. says otherwise
//      (the old explicit set-up; the daemon's own address is then 1.).
//   3. The trainers name the coordinator's host: GRADD_COORDINATOR, else
//      MASTER_ADDR, never MASTER_PORT (that is torch's store, and
//      torchrun's own rendezvous uses 29400). Without a port the daemons use
//      rendezvous.port (default kDefaultRendezvousPort, 29600). When that host
//      is this one, this daemon starts serving the store on that port on
//      demand, so under torchrun the daemon on MASTER_ADDR's machine (node
//      rank 0's) becomes the coordinator by itself; the others connect to it,
//      retrying until the formation timeout while it comes up.
//
// On a machine running several daemons (tests, one-host emulations) the
// first to bind the port serves; the others find it taken and connect to
// it. The server is started without SO_REUSEPORT, so two daemons can never
// split one store between them.
//
// Credentials (server/auth/): the served store checks every call against
// Options::credentials, and Connect() hands them to every client. A daemon
// without credentials takes part in multi-node jobs only with
// Options::insecure (rendezvous.insecure: true); otherwise Resolve and
// Connect refuse with FAILED_PRECONDITION naming the config keys, before
// any port is opened or any call is made.
//
// On etcd (Options::etcd set, rendezvous.backend: etcd) no daemon is the
// coordinator: Resolve gives the first etcd endpoint (the interface routed
// towards it carries the Gloo traffic) and Connect hands out stores
// on it (EtcdStore under the cluster's prefix, keys on this daemon's lease),
// whatever address it is given; no server is ever started.
//
// Thread-safety: every method may be called from any thread; the server,
// once started, lives until Shutdown() or destruction. Shared (shared_ptr)
// with the formation threads, which may outlive the JobManager.
#ifndef GRADD_SERVER_RENDEZVOUS_COORDINATOR_H_
#define GRADD_SERVER_RENDEZVOUS_COORDINATOR_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/auth/node_credentials.h"
#include "server/rendezvous/etcd/etcd_client.h"
#include "server/rendezvous/etcd/etcd_lease.h"
#include "server/rendezvous/etcd/etcd_store.h"
#include "server/rendezvous/kv_store.h"
#include "server/rendezvous/rendezvous_client.h"
#include "server/rendezvous/rendezvous_service.h"

namespace gradd {

inline constexpr int kDefaultRendezvousPort = 29600;

class CoordinatorSelector {
 public:
  struct Options {
    std::string coordinator_address;  // rule 1
    std::string listen_address;       // rule 2
    int port = kDefaultRendezvousPort;
    // Host the on-demand server binds to: "0.0.0.0" (all interfaces), or
    // the address of the configured interface.
    std::string bind_host = "0.0.0.0";
    // Decides whether a host names this machine (IsLocalHost; tests fake it).
    std::function<bool(const std::string&)> is_local;
    // Told the method of every request the served store answers (metrics).
    RendezvousService::RequestObserver on_request;
    // What the daemons prove to each other; null: nothing, which
    // multi-node jobs accept only with `insecure`.
    std::shared_ptr<NodeCredentials> credentials;
    bool insecure = false;
    // The served store's limits (rendezvous.limits) and the node ids
    // allowed to form jobs (rendezvous.expected_node_ids; empty: any).
    KvStore::Options store;
    std::vector<std::string> expected_node_ids;
    // The rendezvous on etcd: the client, this daemon's lease and the
    // store's options (prefix, limits). Null client: the built-in store.
    std::shared_ptr<EtcdClient> etcd;
    std::shared_ptr<EtcdLease> etcd_lease;
    EtcdStore::Options etcd_store;
  };

  // Starts the rule-2 server when listen_address is set (UNAVAILABLE /
  // INVALID_ARGUMENT as RendezvousServer::Start, naming the key).
  static absl::StatusOr<std::shared_ptr<CoordinatorSelector>> Create(
      Options options);

  ~CoordinatorSelector();
  CoordinatorSelector(const CoordinatorSelector&) = delete;
  CoordinatorSelector& operator=(const CoordinatorSelector&) = delete;

  // The host:port of the coordinator for a job whose trainers sent
  // `requested` ("host", "host:port" or ""), starting this daemon's server
  // first when rule 3 makes it the coordinator. INVALID_ARGUMENT when no
  // rule gives an address (the message says what to set) or `requested` is
  // malformed. May block on name resolution.
  absl::StatusOr<std::string> Resolve(const std::string& requested);

  // The daemon's rendezvous store for one user: on the built-in backend a
  // client of the coordinator at `address` (from Resolve) carrying this
  // daemon's credentials, retrying an unavailable coordinator for
  // `connect_timeout`; on etcd an EtcdStore whose every call gives up after
  // `connect_timeout` (EtcdStore::Options::call_timeout). FAILED_PRECONDITION
  // without credentials or insecure.
  absl::StatusOr<std::unique_ptr<RendezvousStoreInterface>> Connect(
      const std::string& address, absl::Duration connect_timeout) const;

  // How the daemon <-> daemon plane is secured, for the log and `graddctl
  // status` (never a secret).
  std::string SecurityDescription() const;
  // "rendezvous backend builtin, coordinator 10.0.0.1:29600" (" (this
  // daemon)" when it serves it; "coordinator named per job by the trainers
  // (...)" without a configured one), or "rendezvous backend etcd at
  // <endpoints> (mTLS + user u, prefix /gradd/, lease 694d... ttl 30s)":
  // never a secret.
  std::string BackendDescription() const;

  // The port this daemon serves the store on, 0 while it serves none, and
  // its address ("127.0.0.1:<port>" for a wildcard host; "" while none).
  int serving_port() const;
  std::string serving_address() const;
  // The configured coordinator (rule 1 or 2), "" when discovery is on demand.
  std::string configured_address() const;

  void Shutdown();

 private:
  explicit CoordinatorSelector(Options options);
  // OK when multi-node jobs may run: credentials, or insecure.
  absl::Status CheckSecured() const;
  RendezvousServer::Options ServerOptions(const std::string& listen) const;
  // Starts the on-demand server on `port` unless one runs. A port another
  // process already holds is not an error: that process (another daemon on
  // this machine) serves the store.
  void EnsureServing(int port);

  const Options options_;
  mutable absl::Mutex mu_;
  std::string configured_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<RendezvousServer> server_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gradd

#endif  // GRADD_SERVER_RENDEZVOUS_COORDINATOR_H_
