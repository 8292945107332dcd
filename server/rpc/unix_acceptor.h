// The daemon's gRPC Unix socket, accepted by gradd itself rather than by
// gRPC: each connection is checked and then handed to the gRPC server
// (grpc::AddInsecureChannelFromFd).
//
// Why not gRPC's own listener: gRPC 1.51 (Debian 12) stops accepting for
// good after one accept() fails with EMFILE, and it cannot check a Unix
// peer's credentials. Here:
// - a peer whose uid (SO_PEERCRED) is neither the daemon's nor root is
//   closed at once, as on the session socket;
// - when accept() fails for want of fds or memory the listening socket is
//   left out of poll for kAcceptBackoff, then accepting resumes by itself
//   (no busy loop, no dead listener).
//
// Threads: Start() spawns the poll thread; Stop() joins it (any thread,
// before the gRPC server is destroyed). Owns the listening socket and
// unlinks it in Stop().
#ifndef GRADD_SERVER_RPC_UNIX_ACCEPTOR_H_
#define GRADD_SERVER_RPC_UNIX_ACCEPTOR_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/session.h"
#include "common/shm.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace gradd {

class UnixAcceptor {
 public:
  static constexpr std::chrono::milliseconds kAcceptBackoff{100};

  // Binds `path` (mode 0600) and listens. The caller removed a stale file.
  static absl::StatusOr<std::unique_ptr<UnixAcceptor>> Create(
      const std::string& path);
  ~UnixAcceptor();  // Stop()s

  // Starts handing accepted connections to `server`, which must outlive
  // Stop().
  void Start(grpc::Server* server);
  void Stop();

  // Who connected the gRPC connection whose ServerContext::peer() is
  // `grpc_peer` ("fd:N" for connections handed over by this acceptor);
  // nullopt for anything else. Any thread. (An fd number is reused only
  // after gRPC closed it, and a closed connection delivers no more calls.)
  std::optional<PeerIdentity> PeerOf(absl::string_view grpc_peer) const;

  // Connections handed to gRPC and refused so far (for tests and stats).
  uint64_t accepted() const { return accepted_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  UnixAcceptor(std::string path, UniqueFd listen_fd, UniqueFd wake_fd);
  void Loop();

  const std::string path_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;
  grpc::Server* server_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> refused_{0};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, PeerIdentity> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradd

#endif  // GRADD_SERVER_RPC_UNIX_ACCEPTOR_H_
