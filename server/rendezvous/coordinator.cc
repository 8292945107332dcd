#include "server/rendezvous/coordinator.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/rendezvous/host_addresses.h"
#include "spdlog/spdlog.h"

namespace gradd {

CoordinatorSelector::CoordinatorSelector(Options options)
    : options_(std::move(options)) {}

CoordinatorSelector::~CoordinatorSelector() { Shutdown(); }

absl::StatusOr<std::shared_ptr<CoordinatorSelector>>
CoordinatorSelector::Create(Options options) {
  if (!options.is_local) options.is_local = IsLocalHost;
  std::shared_ptr<CoordinatorSelector> s(
      new CoordinatorSelector(std::move(options)));
  absl::MutexLock lock(&s->mu_);
  s->configured_ = s->options_.coordinator_address;
  if (const std::string& listen = s->options_.listen_address; !listen.empty()) {
    if (absl::Status secured = s->CheckSecured(); !secured.ok()) {
      return absl::Status(secured.code(),
                          absl::StrCat("rendezvous.listen_address ", listen,
                                       ": ", secured.message()));
    }
    absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
        RendezvousServer::Start(s->ServerOptions(listen));
    if (!server.ok()) {
      return absl::Status(server.status().code(),
                          absl::StrCat("rendezvous.listen_address ", listen,
                                       ": ", server.status().message()));
    }
    s->server_ = *std::move(server);
    if (s->configured_.empty()) s->configured_ = s->server_->address();
  }
  return s;
}

absl::Status CoordinatorSelector::CheckSecured() const {
  if (options_.credentials != nullptr || options_.insecure) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      "this daemon has no credentials for the other daemons: set "
      "rendezvous.token_file and/or rendezvous.tls (cert_file, key_file, "
      "ca_file) on every node, or rendezvous.insecure: true on a network "
      "nobody else can reach (docs/operations.md, \"Securing the daemons' "
      "network\")");
}

std::string CoordinatorSelector::SecurityDescription() const {
  if (options_.credentials != nullptr) {
    return options_.credentials->Describe();
  }
  if (options_.insecure) {
    return "INSECURE (rendezvous.insecure: true): daemon calls carry no "
           "credentials";
  }
  return "no credentials: multi-node jobs refused (single-node only)";
}

std::string CoordinatorSelector::BackendDescription() const {
  if (options_.etcd == nullptr) {
    const std::string configured = configured_address();
    if (configured.empty()) {
      return absl::StrCat(
          "rendezvous backend builtin, coordinator named per job by the "
          "trainers (GRADD_COORDINATOR, else MASTER_ADDR; port ",
          options_.port, ")");
    }
    return absl::StrCat(
        "rendezvous backend builtin, coordinator ", configured,
        serving_address() == configured ? " (this daemon)" : "");
  }
  std::string s = absl::StrCat("rendezvous backend etcd at ",
                               absl::StrJoin(options_.etcd->endpoints(), ","),
                               " (", options_.etcd->SecurityDescription(),
                               ", prefix ", options_.etcd_store.prefix);
  if (options_.etcd_lease != nullptr) {
    absl::StrAppend(&s, ", lease ",
                    absl::Hex(options_.etcd_lease->current_id()), " ttl ",
                    absl::FormatDuration(options_.etcd_lease->ttl()));
  }
  absl::StrAppend(&s, ")");
  return s;
}

RendezvousServer::Options CoordinatorSelector::ServerOptions(
    const std::string& listen) const {
  RendezvousServer::Options o;
  o.listen_address = listen;
  o.on_request = options_.on_request;
  o.credentials = options_.credentials;
  o.store = options_.store;
  o.expected_node_ids = options_.expected_node_ids;
  return o;
}

absl::StatusOr<std::unique_ptr<RendezvousStoreInterface>>
CoordinatorSelector::Connect(const std::string& address,
                             absl::Duration connect_timeout) const {
  RETURN_IF_ERROR(CheckSecured());
  if (options_.etcd != nullptr) {
    EtcdStore::Options o = options_.etcd_store;
    o.max_key_bytes = options_.store.max_key_bytes;
    o.max_value_bytes = options_.store.max_value_bytes;
    // As a coordinator's client keeps trying for connect_timeout: a
    // formation (bounded by the formation timeout) fails in it when etcd is
    // unreachable.
    o.call_timeout = connect_timeout;
    return std::unique_ptr<RendezvousStoreInterface>(
        std::make_unique<EtcdStore>(options_.etcd, options_.etcd_lease, o));
  }
  RendezvousClient::Options o;
  o.address = address;
  o.connect_timeout = connect_timeout;
  o.credentials = options_.credentials;
  o.max_message_bytes = static_cast<int>(
      std::min<size_t>(options_.store.max_value_bytes + (1 << 20),
                       std::numeric_limits<int>::max()));
  ASSIGN_OR_RETURN(std::unique_ptr<RendezvousClient> client,
                   RendezvousClient::Create(o));
  return std::unique_ptr<RendezvousStoreInterface>(std::move(client));
}

absl::StatusOr<std::string> CoordinatorSelector::Resolve(
    const std::string& requested) {
  RETURN_IF_ERROR(CheckSecured());
  // An address, not a description: the formation picks the interface
  // routed towards it (AdvertiseAddress).
  if (options_.etcd != nullptr) return options_.etcd->endpoints().front();
  if (std::string configured = configured_address(); !configured.empty()) {
    return configured;
  }
  if (requested.empty()) {
    return absl::InvalidArgumentError(
        "no rendezvous coordinator is known: the trainers' environment names "
        "none (MASTER_ADDR, or GRADD_COORDINATOR) and the daemon has no "
        "rendezvous.coordinator_address");
  }
  absl::StatusOr<HostPort> parsed = ParseHostPort(requested);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous coordinator from the trainers: ",
                     parsed.status().message()));
  }
  const int port = parsed->port.value_or(options_.port);
  if (port == options_.port && options_.is_local(parsed->host)) {
    EnsureServing(port);
  }
  return JoinHostPort(parsed->host, port);
}

void CoordinatorSelector::EnsureServing(int port) {
  absl::MutexLock lock(&mu_);
  if (server_ != nullptr || shut_down_) return;
  const std::string listen = JoinHostPort(options_.bind_host, port);
  absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
      RendezvousServer::Start(ServerOptions(listen));
  if (!server.ok()) {
    spdlog::info(
        "rendezvous: not serving on {} ({}); another daemon on this machine "
        "is taken to serve it",
        listen, server.status().ToString());
    return;
  }
  server_ = *std::move(server);
  spdlog::info("rendezvous: serving the coordinator store on {} (on demand)",
               listen);
}

int CoordinatorSelector::serving_port() const {
  absl::MutexLock lock(&mu_);
  return server_ != nullptr ? server_->port() : 0;
}

std::string CoordinatorSelector::serving_address() const {
  absl::MutexLock lock(&mu_);
  return server_ != nullptr ? server_->address() : std::string();
}

std::string CoordinatorSelector::configured_address() const {
  absl::MutexLock lock(&mu_);
  return configured_;
}

void CoordinatorSelector::Shutdown() {
  std::unique_ptr<RendezvousServer> server;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    server = std::move(server_);
  }
  if (server != nullptr) server->Shutdown();
}

}  // namespace gradd
