#include "server/rpc/unix_acceptor.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/unix_socket.h"
#include "grpcpp/server.h"
#include "grpcpp/server_posix.h"
#include "server/logging.h"

namespace gradd {

absl::StatusOr<std::unique_ptr<UnixAcceptor>> UnixAcceptor::Create(
    const std::string& path) {
  absl::StatusOr<UniqueFd> fd = ListenUnix(path, SOCK_STREAM | SOCK_NONBLOCK,
                                           /*mode=*/0600, "gRPC socket");
  if (!fd.ok()) return fd.status();
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return ErrnoUnavailable("eventfd for", path);
  return std::unique_ptr<UnixAcceptor>(
      new UnixAcceptor(path, *std::move(fd), std::move(wake)));
}

UnixAcceptor::UnixAcceptor(std::string path, UniqueFd listen_fd,
                           UniqueFd wake_fd)
    : path_(std::move(path)),
      listen_fd_(std::move(listen_fd)),
      wake_fd_(std::move(wake_fd)) {}

UnixAcceptor::~UnixAcceptor() { Stop(); }

void UnixAcceptor::Start(grpc::Server* server) {
  server_ = server;
  thread_ = std::thread([this] { Loop(); });
}

void UnixAcceptor::Stop() {
  stop_.store(true);
  uint64_t one = 1;
  if (wake_fd_.valid()) (void)!write(wake_fd_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  if (listen_fd_.valid()) {
    listen_fd_.reset();
    unlink(path_.c_str());
  }
}

std::optional<PeerIdentity> UnixAcceptor::PeerOf(
    absl::string_view grpc_peer) const {
  int fd = -1;
  if (!absl::ConsumePrefix(&grpc_peer, "fd:") ||
      !absl::SimpleAtoi(grpc_peer, &fd)) {
    return std::nullopt;
  }
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(fd);
  if (it == peers_.end()) return std::nullopt;
  return it->second;
}

void UnixAcceptor::Loop() {
  using Clock = std::chrono::steady_clock;
  Clock::time_point paused_until{};
  while (!stop_.load()) {
    const Clock::time_point now = Clock::now();
    const bool accepting = now >= paused_until;
    pollfd pfds[2] = {{wake_fd_.get(), POLLIN, 0},
                      {accepting ? listen_fd_.get() : -1, POLLIN, 0}};
    const int timeout_ms =
        accepting ? -1
                  : static_cast<int>(
                        std::chrono::duration_cast<std::chrono::milliseconds>(
                            paused_until - now)
                            .count() +
                        1);
    if (poll(pfds, 2, timeout_ms) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("poll on {} failed: {}", path_, std::strerror(errno));
      paused_until = Clock::now() + kAcceptBackoff;
      continue;
    }
    if (pfds[0].revents != 0 || !(pfds[1].revents & POLLIN)) continue;
    UniqueFd fd(accept4(listen_fd_.get(), nullptr, nullptr,
                        SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        spdlog::warn("cannot accept on {} ({}); retrying in {} ms", path_,
                     std::strerror(errno),
                     static_cast<long long>(kAcceptBackoff.count()));
        paused_until = Clock::now() + kAcceptBackoff;
      }
      continue;  // EAGAIN, ECONNABORTED, EINTR: nothing to hand over
    }
    absl::StatusOr<PeerIdentity> cred = SocketPeer(fd.get());
    if (!cred.ok() || (cred->uid != geteuid() && cred->uid != 0)) {
      spdlog::warn("refused gRPC connection from uid {} pid {} on {}",
                   cred.ok() ? cred->uid : 0u, cred.ok() ? cred->pid : 0,
                   path_);
      refused_.fetch_add(1);
      continue;  // closes it
    }
    {
      absl::MutexLock lock(&mu_);
      peers_[fd.get()] = *cred;
    }
    accepted_.fetch_add(1);
    // gRPC owns the fd from here on (and closes it).
    grpc::AddInsecureChannelFromFd(server_, fd.release());
  }
}

}  // namespace gradd
