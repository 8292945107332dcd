// The gradd daemon: wires the session listener, the job manager (engine) and
// the gRPC Node, Admin and grpc.health.v1 Health services on the configured
// Unix socket, and the Prometheus /metrics endpoint (metrics.listen_address)
// over the engine's events.
//
// Owns the reduce thread pool, the listener, the job manager, the gRPC
// server and both socket files, and the coordinator selector
// (rendezvous/coordinator.h): the rendezvous server other nodes' daemons form
// jobs through, served from start-up when rendezvous.listen_address is set,
// else on demand when the trainers name this host as the coordinator, and
// the daemon's credentials for the other daemons (server/auth/:
// rendezvous.token_file, rendezvous.tls), which ReloadCredentials() re-reads
// (main calls it on SIGHUP). Create() does everything that can fail
// (directory, stale sockets, binds, credential files) and reports it;
// Shutdown() is the one orderly way down, called by main on SIGTERM/SIGINT
// (or by the destructor). Thread affinity: Create/Shutdown from the owning
// thread; the parts run their own threads.
#ifndef GRADD_SERVER_DAEMON_H_
#define GRADD_SERVER_DAEMON_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/device_memory.h"
#include "common/thread_pool.h"
#include "gradd/v1/config.pb.h"
#include "grpcpp/server.h"
#include "server/admin/admin_handler.h"
#include "server/admin/job_manager_source.h"
#include "server/auth/node_credentials.h"
#include "server/engine/manager/job_manager.h"
#include "server/metrics/daemon_metrics.h"
#include "server/metrics/metrics_endpoint.h"
#include "server/rendezvous/coordinator.h"
#include "server/rendezvous/rendezvous_service.h"
#include "server/rpc/admin_service.h"
#include "server/rpc/node_service.h"
#include "server/rpc/unix_acceptor.h"
#include "server/session_listener.h"

namespace gradd {

// Creates the socket's directory (and missing parents) mode 0700; refuses an
// existing directory that others may write to (group/world-writable without
// the sticky bit) or that belongs to another user (not us, not root).
// FAILED_PRECONDITION / PERMISSION_DENIED naming the path.
absl::Status PrepareSocketDirectory(const std::string& socket_path);

// Removes `path` if it is a socket nobody listens on. FAILED_PRECONDITION
// if a daemon answers there or the path is not a socket.
absl::Status RemoveStaleSocket(const std::string& path, int socket_type);

class Daemon {
 public:
  // `config` must have defaults applied (ApplyConfigDefaults) and be valid.
  // `devices`: where CUDA buckets are allocated; null: the machine's GPUs
  // (server/device_allocator.h: a clear refusal where there is no driver).
  static absl::StatusOr<std::unique_ptr<Daemon>> Create(
      const v1::DaemonConfig& config,
      std::unique_ptr<DeviceAllocatorInterface> devices = nullptr);
  ~Daemon();

  // Attached trainers get `UNAVAILABLE: gradd daemon shutting down` in their
  // control block, waiting Attach calls the same; the gRPC server drains for
  // at most `grace`; sockets are closed and unlinked; every job's memory is
  // released. Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(2));

  const std::string& socket_path() const { return config_.socket_path(); }
  const std::string& session_path() const { return listener_->path(); }
  JobManager& job_manager() { return *manager_; }
  // The address ("127.0.0.1:<port>" for a wildcard listen address) and
  // port of the rendezvous server rendezvous.listen_address started;
  // empty / 0 without one (on-demand serving is not reported here).
  std::string rendezvous_address() const;
  int rendezvous_port() const;
  // The /metrics endpoint's port (0: metrics.listen_address is empty).
  int metrics_port() const;
  // Re-reads rendezvous.token_file and rendezvous.tls' files; on an error
  // the old ones stay in force. OK (and nothing done) without credentials.
  // Logs what it did.
  absl::Status ReloadCredentials();
  // How the daemon <-> daemon plane is secured (`graddctl status`).
  std::string network_security() const;
  DaemonMetrics& metrics() { return *metrics_; }

 private:
  explicit Daemon(const v1::DaemonConfig& config);

  v1::DaemonConfig config_;
  // Before everything that reports to it; the endpoint only reads it.
  // Shared with the etcd client's and lease's observers.
  std::shared_ptr<DaemonMetrics> metrics_;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
  // Null without rendezvous.token_file / rendezvous.tls.
  std::shared_ptr<NodeCredentials> credentials_;
  // Shared with formation threads (coordinator discovery).
  std::shared_ptr<CoordinatorSelector> coordinator_;
  std::unique_ptr<ThreadPool> pool_;
  // Before manager_: its jobs' device memory is released first.
  std::unique_ptr<DeviceAllocatorInterface> devices_;
  std::unique_ptr<SessionListener> listener_;
  std::unique_ptr<JobManager> manager_;
  std::unique_ptr<CallerCheckInterface> caller_check_;
  std::unique_ptr<NodeService> service_;
  std::unique_ptr<JobManagerAdminSource> admin_source_;
  std::unique_ptr<AdminHandler> admin_handler_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<HealthService> health_service_;
  std::unique_ptr<grpc::Server> server_;
  // Declared after server_: destroyed (joined) before it.
  std::unique_ptr<UnixAcceptor> acceptor_;
  bool down_ = false;
};

}  // namespace gradd

#endif  // GRADD_SERVER_DAEMON_H_
