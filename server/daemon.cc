#include "server/daemon.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/session.h"
#include "common/shm.h"
#include "common/status_macros.h"
#include "common/unix_socket.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "server/admin/rendezvous_view.h"
#include "server/config.h"
#include "server/device_allocator.h"
#include "server/logging.h"
#include "server/rendezvous/etcd/etcd_client.h"
#include "server/rendezvous/etcd/etcd_lease.h"
#include "server/rendezvous/host_addresses.h"
#include "server/rpc/unix_acceptor.h"

namespace gradd {
namespace {

// The whole of `path`, or an error naming the config key; never the text.
absl::StatusOr<std::string> ReadEtcdFile(absl::string_view key,
                                         const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous.etcd.", key, " = '", path, "': cannot be read"));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous.etcd.", key, " = '", path, "' is empty"));
  }
  return text.str();
}

// The etcd client of rendezvous.etcd (validated by ValidateConfig),
// counting its calls in `metrics`.
absl::StatusOr<std::shared_ptr<EtcdClient>> MakeEtcdClient(
    const v1::RendezvousEtcdConfig& config,
    const std::shared_ptr<DaemonMetrics>& metrics) {
  EtcdClient::Options o;
  o.on_call = [metrics](absl::string_view method, absl::StatusCode code) {
    metrics->OnEtcdCall(method, code);
  };
  o.on_endpoint_failure = [metrics](absl::string_view endpoint) {
    metrics->OnEtcdEndpointFailure(endpoint);
  };
  for (absl::string_view e :
       absl::StrSplit(config.endpoints(), ',', absl::SkipWhitespace())) {
    o.endpoints.emplace_back(absl::StripAsciiWhitespace(e));
  }
  if (!config.ca_file().empty()) {
    ASSIGN_OR_RETURN(o.tls.ca_pem, ReadEtcdFile("ca_file", config.ca_file()));
  }
  if (!config.cert_file().empty()) {
    ASSIGN_OR_RETURN(o.tls.cert_pem,
                     ReadEtcdFile("cert_file", config.cert_file()));
    ASSIGN_OR_RETURN(o.tls.key_pem,
                     ReadEtcdFile("key_file", config.key_file()));
  }
  o.tls.server_name = config.server_name();
  if (!config.user().empty()) {
    ASSIGN_OR_RETURN(std::string password,
                     ReadEtcdFile("password_file", config.password_file()));
    o.user = config.user();
    o.password = std::string(absl::StripAsciiWhitespace(
        absl::string_view(password).substr(0, password.find('\n'))));
  }
  absl::StatusOr<std::unique_ptr<EtcdClient>> client =
      EtcdClient::Create(std::move(o));
  if (!client.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous.etcd: ", client.status().message()));
  }
  return std::shared_ptr<EtcdClient>(*std::move(client));
}

// Registration of a large model (100k parameters with names) exceeds gRPC's
// 4 MiB default.
constexpr int kMaxMessageBytes = 256 << 20;

absl::Status ErrnoStatus(absl::string_view what, const std::string& path) {
  const int e = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(e));
  if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(msg);
  return absl::FailedPreconditionError(msg);
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::Status PrepareSocketDirectory(const std::string& socket_path) {
  const std::string dir = DirName(socket_path);
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT)
      return ErrnoStatus("cannot stat socket directory", dir);
    // mkdir -p; everything we create is owner-only.
    for (size_t pos = 1; pos != std::string::npos;) {
      pos = dir.find('/', pos + 1);
      const std::string part = dir.substr(0, pos);
      if (mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) {
        return ErrnoStatus("cannot create socket directory", part);
      }
    }
    // mkdir honours the umask; make the mode exact.
    if (chmod(dir.c_str(), 0700) != 0) {
      return ErrnoStatus("cannot chmod socket directory", dir);
    }
    return absl::OkStatus();
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("socket directory ", dir, " is not a directory"));
  }
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("socket directory ", dir, " belongs to uid ", st.st_uid,
                     ", not to gradd's uid ", geteuid(),
                     " or root; refusing to serve "
                     "from a directory another user controls"));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "socket directory %s is writable by other users (mode %04o) and not "
        "sticky; anyone could replace gradd's socket. Use an owner-only "
        "directory (chmod 700) or another --socket",
        dir, st.st_mode & 07777));
  }
  return absl::OkStatus();
}

absl::Status RemoveStaleSocket(const std::string& path, int socket_type) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus("cannot stat", path);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " exists and is not a socket; refusing to replace it"));
  }
  const std::optional<sockaddr_un> addr = UnixAddress(path);
  if (!addr.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path too long: ", path));
  }
  UniqueFd fd(socket(AF_UNIX, socket_type | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("socket() to probe", path);
  const int connect_errno = ConnectUnix(fd.get(), *addr);
  if (connect_errno == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("another gradd is already listening on ", path));
  }
  if (connect_errno != ECONNREFUSED && connect_errno != ENOENT) {
    return ErrnoStatus("cannot probe existing socket", path);
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus("cannot remove stale socket", path);
  }
  return absl::OkStatus();
}

namespace {

// Raises the soft RLIMIT_NOFILE to the hard limit: every rank of every job
// holds a session socket and its gRPC connection, and a distribution's soft
// default (1024) is far below what a busy node needs. The session caps
// (max_sessions) keep idle connections well below it.
void RaiseFdLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max) {
    return;
  }
  const rlim_t old = lim.rlim_cur;
  lim.rlim_cur = lim.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
    spdlog::warn("cannot raise the fd limit from {}: {}",
                 static_cast<unsigned long long>(old), std::strerror(errno));
  }
}

KvStore::Options StoreOptionsOf(const v1::RendezvousLimits& l) {
  KvStore::Options o;
  o.max_key_bytes = l.max_key_bytes();
  o.max_value_bytes = l.max_value_bytes();
  o.max_keys_per_job = l.max_keys_per_job();
  o.max_job_bytes = l.max_job_bytes();
  o.max_total_bytes = l.max_total_bytes();
  o.max_rounds_per_minute = static_cast<int>(
      std::min<uint32_t>(l.max_rounds_per_job_per_minute(), 1 << 30));
  o.job_ttl = absl::Seconds(l.job_ttl_s());
  return o;
}

}  // namespace

Daemon::Daemon(const v1::DaemonConfig& config) : config_(config) {}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Create(
    const v1::DaemonConfig& config,
    std::unique_ptr<DeviceAllocatorInterface> devices) {
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(ValidateConfig(config));
  RETURN_IF_ERROR(ValidateNodeSecurity(config));
  RaiseFdLimit();
  const std::string& path = config.socket_path();
  const std::string session_path = SessionSocketPath(path);
  RETURN_IF_ERROR(PrepareSocketDirectory(path));
  RETURN_IF_ERROR(RemoveStaleSocket(path, SOCK_STREAM));
  RETURN_IF_ERROR(RemoveStaleSocket(session_path, SOCK_SEQPACKET));

  std::unique_ptr<Daemon> d(new Daemon(config));
  // Shared with the etcd client's and lease's observers, which may run on
  // formation threads that outlive the daemon.
  d->metrics_ =
      std::make_shared<DaemonMetrics>(config.metrics().new_label_values());
  if (const std::string& listen = config.metrics().listen_address();
      !listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
        MetricsEndpoint::Create(listen, d->metrics_->registry());
    if (!endpoint.ok()) {
      return absl::Status(endpoint.status().code(),
                          absl::StrCat("metrics.listen_address: ",
                                       endpoint.status().message()));
    }
    d->metrics_endpoint_ = *std::move(endpoint);
  }
  const v1::RendezvousConfig& rv = config.rendezvous();
  if (HasNodeCredentials(rv)) {
    ASSIGN_OR_RETURN(d->credentials_,
                     NodeCredentials::Load(NodeCredentialsOptionsOf(rv)));
  }
  CoordinatorSelector::Options coordinator;
  coordinator.coordinator_address = rv.coordinator_address();
  coordinator.listen_address = rv.listen_address();
  coordinator.port = static_cast<int>(rv.port());
  coordinator.credentials = d->credentials_;
  coordinator.insecure = rv.insecure();
  coordinator.store = StoreOptionsOf(rv.limits());
  for (absl::string_view id :
       absl::StrSplit(rv.expected_node_ids(), ',', absl::SkipWhitespace())) {
    coordinator.expected_node_ids.emplace_back(absl::StripAsciiWhitespace(id));
  }
  coordinator.on_request = [metrics =
                                d->metrics_.get()](absl::string_view method) {
    metrics->OnRendezvousRequest(method);
  };
  if (!rv.interface().empty()) {
    // Checked now so a misspelt interface stops the daemon at start-up,
    // not the first multi-node job.
    absl::StatusOr<std::string> address = InterfaceAddress(rv.interface());
    if (!address.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rendezvous.interface: ", address.status().message()));
    }
    coordinator.bind_host = *address;
  }
  if (rv.backend() == "etcd") {
    ASSIGN_OR_RETURN(coordinator.etcd, MakeEtcdClient(rv.etcd(), d->metrics_));
    d->metrics_->EnableEtcd(coordinator.etcd->endpoints(),
                            EtcdClient::kMethods);
    ASSIGN_OR_RETURN(
        std::unique_ptr<EtcdLease> lease,
        EtcdLease::Create(coordinator.etcd,
                          absl::Milliseconds(rv.etcd().lease_ttl_ms()),
                          [metrics = d->metrics_](EtcdLeaseEvent event,
                                                  const EtcdLeaseInfo& info) {
                            metrics->OnEtcdLease(event, info);
                          }));
    coordinator.etcd_lease = std::move(lease);
    coordinator.etcd_store.prefix = rv.etcd().prefix();
  }
  std::shared_ptr<EtcdClient> etcd = coordinator.etcd;
  std::shared_ptr<EtcdLease> etcd_lease = coordinator.etcd_lease;
  ASSIGN_OR_RETURN(d->coordinator_,
                   CoordinatorSelector::Create(std::move(coordinator)));
  spdlog::info("{}", d->coordinator_->BackendDescription());
  {
    DaemonMetrics::RendezvousBackend backend;
    backend.backend = rv.backend();
    if (etcd != nullptr) {
      backend.address = absl::StrJoin(etcd->endpoints(), ",");
      backend.security = etcd->SecurityDescription();
      backend.prefix = rv.etcd().prefix();
    } else {
      backend.address = d->coordinator_->configured_address();
    }
    d->metrics_->SetRendezvousBackend(backend);
  }
  if (rv.insecure()) {
    spdlog::warn(
        "daemon network: INSECURE (rendezvous.insecure: true): calls between "
        "daemons carry no credentials; anyone who reaches this daemon's "
        "rendezvous port can read and change every job's formation");
  } else {
    spdlog::info("daemon network: {}", d->coordinator_->SecurityDescription());
  }
  d->pool_ = std::make_unique<ThreadPool>(config.reduce_threads());
  SessionListener::Options session_options;
  session_options.max_sessions = config.max_sessions();
  session_options.max_sessions_per_uid = config.max_sessions_per_uid();
  session_options.max_sessions_per_process = config.max_sessions_per_process();
  session_options.idle_timeout =
      std::chrono::milliseconds(config.session_idle_timeout_ms());
  ASSIGN_OR_RETURN(d->listener_,
                   SessionListener::Create(session_path, session_options));
  d->devices_ = devices != nullptr ? std::move(devices) : MakeDeviceAllocator();
  if (absl::StatusOr<int> probe = d->devices_->FindDevice("");
      absl::IsFailedPrecondition(probe.status())) {
    spdlog::info("no GPU support: {} (CPU jobs only)",
                 probe.status().message());
  } else {
    spdlog::info("GPU support: CUDA driver {}", d->devices_->driver_version());
  }
  d->manager_ = std::make_unique<JobManager>(
      d->config_, d->listener_.get(), d->pool_.get(),
      /*reducer_factory=*/nullptr, d->coordinator_, d->metrics_.get(),
      d->devices_.get());
  d->listener_->Start(d->manager_.get());

  // The gRPC socket is accepted by gradd (rpc/unix_acceptor.h: peer
  // credentials, no dead listener after EMFILE); the server itself listens
  // on no port. Calls that act for a session must come from its owner.
  ASSIGN_OR_RETURN(d->acceptor_, UnixAcceptor::Create(path));
  d->caller_check_ = std::make_unique<SessionCallerCheck>(d->acceptor_.get(),
                                                          d->listener_.get());
  d->service_ =
      std::make_unique<NodeService>(d->manager_.get(), d->caller_check_.get());
  // Admin and health read the engine through snapshots (admin/).
  d->admin_source_ = std::make_unique<JobManagerAdminSource>(
      d->manager_.get(), d->listener_.get());
  AdminHandlerOptions admin_options;
  admin_options.version = GRADD_VERSION;
  admin_options.start_time = start;
  admin_options.config = d->config_;
  admin_options.pid = getpid();
  admin_options.network_security = [selector = d->coordinator_] {
    return selector->SecurityDescription();
  };
  admin_options.rendezvous = [selector = d->coordinator_, etcd, etcd_lease,
                              backend = rv.backend(), port = rv.port(),
                              prefix = rv.etcd().prefix()] {
    RendezvousFacts facts;
    facts.backend = backend;
    if (etcd != nullptr) {
      facts.etcd_endpoints = etcd->endpoints();
      facts.etcd_security = etcd->SecurityDescription();
      facts.etcd_prefix = prefix;
      if (etcd_lease != nullptr) facts.lease = etcd_lease->Info();
    } else {
      facts.coordinator_address = selector->configured_address();
      facts.port = port;
      facts.serving_address = selector->serving_address();
    }
    return RendezvousStatusOf(facts, absl::Now());
  };
  d->admin_handler_ = std::make_unique<AdminHandler>(d->admin_source_.get(),
                                                     std::move(admin_options));
  d->admin_service_ = std::make_unique<AdminService>(d->admin_handler_.get());
  d->health_service_ = std::make_unique<HealthService>(d->admin_handler_.get());
  grpc::ServerBuilder builder;
  builder.RegisterService(d->service_.get());
  builder.RegisterService(d->admin_service_.get());
  builder.RegisterService(d->health_service_.get());
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  d->server_ = builder.BuildAndStart();
  if (d->server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot start the gRPC server for unix:", path));
  }
  d->acceptor_->Start(d->server_.get());
  return d;
}

Daemon::~Daemon() { Shutdown(); }

std::string Daemon::rendezvous_address() const {
  return config_.rendezvous().listen_address().empty()
             ? std::string()
             : coordinator_->serving_address();
}

int Daemon::rendezvous_port() const {
  return config_.rendezvous().listen_address().empty()
             ? 0
             : coordinator_->serving_port();
}

absl::Status Daemon::ReloadCredentials() {
  if (credentials_ == nullptr) {
    spdlog::info(
        "SIGHUP: no rendezvous.token_file or rendezvous.tls configured; "
        "nothing to reload");
    return absl::OkStatus();
  }
  if (absl::Status s = credentials_->Reload(); !s.ok()) {
    spdlog::error(
        "SIGHUP: reloading the daemon credentials failed, keeping the old "
        "ones: {}",
        s.message());
    return s;
  }
  spdlog::info("SIGHUP: daemon credentials reloaded: {}",
               credentials_->Describe());
  return absl::OkStatus();
}

std::string Daemon::network_security() const {
  return coordinator_->SecurityDescription();
}

int Daemon::metrics_port() const {
  return metrics_endpoint_ != nullptr ? metrics_endpoint_->port() : 0;
}

void Daemon::Shutdown(absl::Duration grace) {
  if (down_) return;
  down_ = true;
  // Trainers first: they learn why before their connections go away.
  if (manager_) manager_->Shutdown();
  if (acceptor_) acceptor_->Stop();  // no new connections; unlinks the socket
  if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  if (listener_) listener_->Stop();
  if (manager_) manager_->Stop();
  if (server_) {
    server_->Wait();
    unlink(config_.socket_path().c_str());
  }
  // Last: other nodes' daemons may still be finishing their jobs' rounds.
  if (coordinator_) coordinator_->Shutdown();
}

}  // namespace gradd
