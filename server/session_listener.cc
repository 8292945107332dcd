#include "server/session_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/session.h"

namespace gradd {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SessionListener>> SessionListener::Create(
    const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("session socket path too long: ", path));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Errno("socket() for", path);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("cannot bind session socket", path);
  }
  // Only our uid may connect; SO_PEERCRED is checked again at accept.
  if (chmod(path.c_str(), 0600) != 0) return Errno("chmod", path);
  if (listen(fd.get(), 128) != 0) return Errno("listen on", path);
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return Errno("eventfd for", path);
  // Random start: a stale session id from a previous daemon never matches.
  std::random_device rd;
  uint64_t first = (uint64_t{rd()} << 32 | rd()) & ((uint64_t{1} << 62) - 1);
  return std::unique_ptr<SessionListener>(
      new SessionListener(path, std::move(fd), std::move(wake), first + 1));
}

SessionListener::SessionListener(std::string path, UniqueFd listen_fd,
                                 UniqueFd wake_fd, uint64_t first_id)
    : path_(std::move(path)),
      listen_fd_(std::move(listen_fd)),
      wake_fd_(std::move(wake_fd)),
      next_id_(first_id) {}

SessionListener::~SessionListener() { Stop(); }

void SessionListener::Start(SessionObserverInterface* observer) {
  observer_ = observer;
  thread_ = std::thread([this] { Loop(); });
}

void SessionListener::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  uint64_t one = 1;
  (void)!write(wake_fd_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  sessions_.clear();
  if (listen_fd_.valid()) {
    listen_fd_.reset();
    unlink(path_.c_str());
  }
}

bool SessionListener::IsLive(uint64_t session_id) const {
  absl::MutexLock lock(&mu_);
  return sessions_.contains(session_id);
}

absl::Status SessionListener::SendFds(uint64_t session_id, uint64_t attach_id,
                                      const std::vector<int>& fds) {
  SessionFds msg;
  msg.attach_id = attach_id;
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::UnavailableError(
        absl::StrCat("session ", session_id, " is closed"));
  }
  return SendWithFds(
      it->second.get(),
      std::string_view(reinterpret_cast<const char*>(&msg), sizeof(msg)), fds);
}

void SessionListener::Accept() {
  UniqueFd fd(accept4(listen_fd_.get(), nullptr, nullptr,
                      SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!fd.valid()) return;  // EAGAIN / ECONNABORTED: nothing to do
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
      (cred.uid != geteuid() && cred.uid != 0)) {
    std::fprintf(stderr, "gradd: refused session from uid %u pid %d on %s\n",
                 cred.uid, cred.pid, path_.c_str());
    return;
  }
  // Register the session before greeting: the trainer calls Attach with the
  // id as soon as it reads the hello, and Attach must find the session.
  SessionHello hello;
  const int raw_fd = fd.get();
  {
    absl::MutexLock lock(&mu_);
    hello.session_id = next_id_++;
    sessions_.emplace(hello.session_id, std::move(fd));
  }
  if (send(raw_fd, &hello, sizeof(hello), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(sizeof(hello))) {
    absl::MutexLock lock(&mu_);
    sessions_.erase(hello.session_id);
  }
}

void SessionListener::Loop() {
  std::vector<pollfd> pfds;
  std::vector<uint64_t> ids;
  while (true) {
    pfds.clear();
    ids.clear();
    pfds.push_back({wake_fd_.get(), POLLIN, 0});
    pfds.push_back({listen_fd_.get(), POLLIN, 0});
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      for (const auto& [id, fd] : sessions_) {
        pfds.push_back({fd.get(), POLLIN | POLLRDHUP, 0});
        ids.push_back(id);
      }
    }
    if (poll(pfds.data(), pfds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "gradd: poll on session sockets failed: %s\n",
                   std::strerror(errno));
      return;
    }
    if (pfds[0].revents != 0) continue;  // Stop(): re-check stopping_
    if (pfds[1].revents & POLLIN) Accept();
    for (size_t i = 2; i < pfds.size(); ++i) {
      short ev = pfds[i].revents;
      if (ev == 0) continue;
      bool closed = ev & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL);
      if (!closed && (ev & POLLIN)) {
        // Trainers send nothing on this socket after the hello; drain
        // anything unexpected so poll does not spin, and watch for EOF.
        char buf[256];
        ssize_t n = recv(pfds[i].fd, buf, sizeof(buf), MSG_DONTWAIT);
        closed = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
      }
      if (!closed) continue;
      {
        absl::MutexLock lock(&mu_);
        sessions_.erase(ids[i - 2]);
      }
      if (observer_ != nullptr) observer_->OnSessionClosed(ids[i - 2]);
    }
  }
}

}  // namespace gradd
