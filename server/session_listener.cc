#include "server/session_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/session.h"
#include "common/unix_socket.h"
#include "server/logging.h"

namespace gradd {
namespace {

// Tells a peer why it is not served, best effort (the socket is
// non-blocking and a fresh connection's buffer has room).
void Refuse(int fd, absl::StatusCode code, absl::string_view reason) {
  SessionRefused msg;
  msg.code = static_cast<int32_t>(code);
  const size_t n = std::min(reason.size(), kSessionReasonBytes - 1);
  std::memcpy(msg.reason, reason.data(), n);
  (void)!send(fd, &msg, sizeof(msg), MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SessionListener>> SessionListener::Create(
    const std::string& path, const Options& options) {
  // Only our uid may connect; SO_PEERCRED is checked again at accept.
  absl::StatusOr<UniqueFd> fd =
      ListenUnix(path, SOCK_SEQPACKET, /*mode=*/0600, "session socket");
  if (!fd.ok()) return fd.status();
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return ErrnoUnavailable("eventfd for", path);
  return std::unique_ptr<SessionListener>(
      new SessionListener(path, *std::move(fd), std::move(wake), options));
}

SessionListener::SessionListener(std::string path, UniqueFd listen_fd,
                                 UniqueFd wake_fd, const Options& options)
    : path_(std::move(path)),
      listen_fd_(std::move(listen_fd)),
      wake_fd_(std::move(wake_fd)),
      options_(options) {}

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
  per_uid_.clear();
  per_pid_.clear();
  if (listen_fd_.valid()) {
    listen_fd_.reset();
    unlink(path_.c_str());
  }
}

bool SessionListener::IsLive(uint64_t session_id) const {
  absl::MutexLock lock(&mu_);
  return sessions_.contains(session_id);
}

bool SessionListener::Claim(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return false;
  it->second.claimed = true;
  return true;
}

void SessionListener::Unclaim(uint64_t session_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end() || !it->second.claimed) return;
    it->second.claimed = false;
    it->second.idle_since = Clock::now();
  }
  // The poll thread recomputes its next expiry.
  uint64_t one = 1;
  (void)!write(wake_fd_.get(), &one, sizeof(one));
}

void SessionListener::Erase(
    absl::flat_hash_map<uint64_t, Session>::iterator it) {
  if (--per_uid_[it->second.uid] == 0) per_uid_.erase(it->second.uid);
  if (it->second.pid != 0 && --per_pid_[it->second.pid] == 0) {
    per_pid_.erase(it->second.pid);
  }
  sessions_.erase(it);
}

uint64_t SessionListener::ReapIdle(uid_t uid, pid_t pid,
                                   Clock::time_point now) {
  auto victim = sessions_.end();
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    const Session& s = it->second;
    if (s.uid != uid || s.claimed || (s.pid == pid && pid != 0) ||
        now - s.idle_since < kReapAfter) {
      continue;
    }
    if (victim == sessions_.end() || s.idle_since < victim->second.idle_since) {
      victim = it;
    }
  }
  if (victim == sessions_.end()) return 0;
  const uint64_t id = victim->first;
  const Session& s = victim->second;
  const long long idle_ms = static_cast<long long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now - s.idle_since)
          .count());
  spdlog::info(
      "closed idle session {} of uid {} pid {} (no Attach for {} ms) to make "
      "room for pid {}: uid {} is at max_sessions_per_uid",
      id, s.uid, s.pid, idle_ms, pid, uid);
  Refuse(s.fd.get(), absl::StatusCode::kResourceExhausted,
         absl::StrCat("closed: no Attach used this session for ", idle_ms,
                      " ms and another process of uid ", uid,
                      " needed one (max_sessions_per_uid)"));
  Erase(victim);
  return id;
}

std::optional<PeerIdentity> SessionListener::PeerOf(uint64_t session_id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return std::nullopt;
  return PeerIdentity{it->second.pid, it->second.uid};
}

size_t SessionListener::num_sessions() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
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
      it->second.fd.get(),
      std::string_view(reinterpret_cast<const char*>(&msg), sizeof(msg)), fds);
}

uint64_t SessionListener::NewSessionId() const {
  while (true) {
    uint64_t id = 0;
    if (getrandom(&id, sizeof(id), 0) != static_cast<ssize_t>(sizeof(id))) {
      // getrandom on Linux >= 3.17 does not fail for 8 bytes once the pool
      // is initialised; fall back to the C++ generator rather than abort.
      std::random_device rd;
      id = uint64_t{rd()} << 32 | rd();
    }
    id &= (uint64_t{1} << 62) - 1;
    if (id != 0 && !sessions_.contains(id)) return id;
  }
}

bool SessionListener::Accept(std::vector<uint64_t>* closed) {
  UniqueFd fd(accept4(listen_fd_.get(), nullptr, nullptr,
                      SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!fd.valid()) {
    // Out of fds or memory: the pending connection stays in the backlog,
    // so polling again at once would spin. The caller backs off.
    return !(errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
             errno == ENOMEM);
  }
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
      (cred.uid != geteuid() && cred.uid != 0)) {
    spdlog::warn("refused session from uid {} pid {} on {}", cred.uid, cred.pid,
                 path_);
    Refuse(fd.get(), absl::StatusCode::kPermissionDenied,
           absl::StrCat("this daemon runs as uid ", geteuid(),
                        " and serves only root and uid ", geteuid(),
                        "; the trainer runs as uid ", cred.uid));
    return true;
  }
  // Register the session before greeting: the trainer calls Attach with the
  // id as soon as it reads the hello, and Attach must find the session.
  SessionHello hello;
  const int raw_fd = fd.get();
  {
    absl::MutexLock lock(&mu_);
    std::string refusal;
    const Clock::time_point now = Clock::now();
    // pid 0: a peer in a pid namespace the daemon cannot see; all such
    // peers would share one count, so none is capped per process.
    const uint32_t of_process =
        cred.pid == 0 ? 0
                      : (per_pid_.contains(cred.pid) ? per_pid_[cred.pid] : 0);
    const uint32_t of_uid =
        per_uid_.contains(cred.uid) ? per_uid_[cred.uid] : 0;
    if (sessions_.size() >= options_.max_sessions) {
      refusal = absl::StrCat("the daemon has ", sessions_.size(),
                             " open sessions, its limit (max_sessions)");
    } else if (of_process >= options_.max_sessions_per_process &&
               // Else implied by the uid's cap, whose refusal says more.
               options_.max_sessions_per_process <
                   options_.max_sessions_per_uid) {
      refusal = absl::StrCat("pid ", cred.pid, " (uid ", cred.uid, ") has ",
                             of_process,
                             " open sessions, the limit per process "
                             "(max_sessions_per_process)");
    } else if (of_uid >= options_.max_sessions_per_uid) {
      if (const uint64_t reaped = ReapIdle(cred.uid, cred.pid, now);
          reaped != 0) {
        closed->push_back(reaped);
      } else {
        refusal = absl::StrCat("uid ", cred.uid, " has ", of_uid,
                               " open sessions, the limit per uid "
                               "(max_sessions_per_uid), none of them idle "
                               "for ",
                               kReapAfter.count(), " ms in another process");
      }
    }
    if (!refusal.empty()) {
      spdlog::warn("refused session from uid {} pid {}: {}", cred.uid, cred.pid,
                   refusal);
      Refuse(raw_fd, absl::StatusCode::kResourceExhausted, refusal);
      return true;
    }
    hello.session_id = NewSessionId();
    ++per_uid_[cred.uid];
    if (cred.pid != 0) ++per_pid_[cred.pid];
    sessions_.emplace(hello.session_id,
                      Session{std::move(fd), cred.uid, cred.pid, false, now});
  }
  spdlog::debug("session {} opened by uid {} pid {}", hello.session_id,
                cred.uid, cred.pid);
  if (send(raw_fd, &hello, sizeof(hello), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(sizeof(hello))) {
    absl::MutexLock lock(&mu_);
    if (auto it = sessions_.find(hello.session_id); it != sessions_.end()) {
      Erase(it);
    }
  }
  return true;
}

std::vector<uint64_t> SessionListener::ExpireIdle(Clock::time_point now,
                                                  Clock::time_point* next) {
  std::vector<uint64_t> closed;
  *next = Clock::time_point::max();
  for (auto& [id, session] : sessions_) {
    if (session.claimed) continue;
    const Clock::time_point expiry = session.idle_since + options_.idle_timeout;
    if (expiry <= now) {
      spdlog::info(
          "closed session {} of uid {} pid {}: no Attach within {} ms "
          "(session_idle_timeout_ms)",
          id, session.uid, session.pid,
          static_cast<long long>(options_.idle_timeout.count()));
      Refuse(session.fd.get(), absl::StatusCode::kDeadlineExceeded,
             absl::StrCat("no Attach used this session within ",
                          options_.idle_timeout.count(),
                          " ms (session_idle_timeout_ms)"));
      closed.push_back(id);
    } else {
      *next = std::min(*next, expiry);
    }
  }
  for (uint64_t id : closed) Erase(sessions_.find(id));
  return closed;
}

void SessionListener::Loop() {
  std::vector<pollfd> pfds;
  std::vector<uint64_t> ids;
  while (true) {
    pfds.clear();
    ids.clear();
    const Clock::time_point now = Clock::now();
    Clock::time_point next = Clock::time_point::max();
    std::vector<uint64_t> expired;
    const bool accepting = now >= accept_paused_until_;
    pfds.push_back({wake_fd_.get(), POLLIN, 0});
    // While accepting is paused the listening socket is polled for nothing
    // (fd -1 is ignored by poll), so a full backlog cannot wake us.
    pfds.push_back({accepting ? listen_fd_.get() : -1, POLLIN, 0});
    if (!accepting) next = accept_paused_until_;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      Clock::time_point idle_next;
      expired = ExpireIdle(now, &idle_next);
      next = std::min(next, idle_next);
      for (const auto& [id, session] : sessions_) {
        pfds.push_back({session.fd.get(), POLLIN | POLLRDHUP, 0});
        ids.push_back(id);
      }
    }
    if (observer_ != nullptr) {
      for (uint64_t id : expired) observer_->OnSessionClosed(id);
    }
    int timeout_ms = -1;
    if (next != Clock::time_point::max()) {
      timeout_ms = static_cast<int>(std::max<int64_t>(
          1, std::chrono::duration_cast<std::chrono::milliseconds>(next - now)
                     .count() +
                 1));
    }
    if (poll(pfds.data(), pfds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("poll on session sockets failed: {}", std::strerror(errno));
      return;
    }
    if (pfds[0].revents != 0) {
      // Stop() (re-check stopping_) or Unclaim() (recompute the expiry).
      uint64_t count = 0;
      (void)!read(wake_fd_.get(), &count, sizeof(count));
      continue;
    }
    if (pfds[1].revents & POLLIN) {
      std::vector<uint64_t> reaped;
      const bool accepted = Accept(&reaped);
      const int accept_errno = errno;
      if (observer_ != nullptr) {
        for (uint64_t id : reaped) observer_->OnSessionClosed(id);
      }
      if (!accepted) {
        spdlog::warn("cannot accept sessions on {} ({}); retrying in {} ms",
                     path_, std::strerror(accept_errno),
                     static_cast<long long>(kAcceptBackoff.count()));
        accept_paused_until_ = Clock::now() + kAcceptBackoff;
      }
      // A closed session's fd number may now be the new session's: the
      // events polled for it are stale. Poll again (level-triggered).
      if (!reaped.empty()) continue;
    }
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
        auto it = sessions_.find(ids[i - 2]);
        if (it == sessions_.end()) continue;
        spdlog::debug("session {} of uid {} pid {} closed", it->first,
                      it->second.uid, it->second.pid);
        Erase(it);
      }
      if (observer_ != nullptr) observer_->OnSessionClosed(ids[i - 2]);
    }
  }
}

}  // namespace gradd
