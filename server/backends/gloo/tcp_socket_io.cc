// The socket helpers of gradd's Gloo transport (tcp_internal.h).
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gloo/common/error.h"
#include "gloo/transport/buffer.h"
#include "gloo/transport/context.h"
#include "gloo/transport/pair.h"
#include "gloo/transport/unbound_buffer.h"
#include "server/auth/pair_handshake.h"
#include "server/backends/gloo/tcp_internal.h"
#include "spdlog/spdlog.h"

namespace gradd {
namespace tcp_internal {

void PutU32(char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(v >> (24 - 8 * i));
}
uint32_t GetU32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(in[i]);
  return v;
}

std::string AddressText(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(addr);
    inet_ntop(AF_INET6, &in6.sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(in6.sin6_port));
  }
  const auto& in = reinterpret_cast<const sockaddr_in&>(addr);
  inet_ntop(AF_INET, &in.sin_addr, host, sizeof(host));
  return absl::StrCat(host, ":", ntohs(in.sin_port));
}

socklen_t SockaddrLen(const sockaddr_storage& addr) {
  return addr.ss_family == AF_INET6 ? sizeof(sockaddr_in6)
                                    : sizeof(sockaddr_in);
}

void SetNoDelay(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

bool SetBlocking(int fd, bool blocking) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags == -1) return false;
  const int want = blocking ? (flags & ~O_NONBLOCK) : (flags | O_NONBLOCK);
  return fcntl(fd, F_SETFL, want) != -1;
}

// Closes with a reset: the other end learns at once, and no TIME_WAIT is
// left behind.
void CloseWithReset(int fd) {
  struct linger reset = {1, 0};
  (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  ::close(fd);
}

// Non-blocking: sends what is left of `out` after `*pos`.
Io SendSome(int fd, const std::string& out, size_t* pos, int* err) {
  while (*pos < out.size()) {
    const ssize_t n = ::send(fd, out.data() + *pos, out.size() - *pos,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Io::kAgain;
      *err = errno;
      return Io::kError;
    }
    *pos += static_cast<size_t>(n);
  }
  return Io::kDone;
}

// Non-blocking: reads until `in` holds `need` bytes, never more (what
// follows the handshake is the data path's).
Io RecvUpTo(int fd, std::string* in, size_t need, int* err) {
  while (in->size() < need) {
    char buf[128];
    const size_t want = std::min(sizeof(buf), need - in->size());
    const ssize_t n = ::recv(fd, buf, want, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Io::kAgain;
      *err = errno;
      return Io::kError;
    }
    if (n == 0) return Io::kClosed;
    in->append(buf, static_cast<size_t>(n));
  }
  return Io::kDone;
}

// Waits for `events` on `fd` until `deadline`; false on timeout.
bool PollUntil(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(
        &p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // Let the I/O call report.
  }
}

// Blocking (by poll) up to `deadline`: a handshake step on the connecting
// side. Returns "" or why it failed.
std::string WriteAllBy(int fd, const std::string& out,
                       Clock::time_point deadline) {
  size_t pos = 0;
  for (;;) {
    int err = 0;
    const Io io = SendSome(fd, out, &pos, &err);
    if (io == Io::kDone) return "";
    if (io == Io::kError) {
      return absl::StrCat("sending the handshake failed: ", strerror(err));
    }
    if (!PollUntil(fd, POLLOUT, deadline)) {
      return "it did not take the handshake in time";
    }
  }
}

// Reads exactly `n` bytes by `deadline`; `*closed` when the peer closed.
std::string ReadExactlyBy(int fd, size_t n, Clock::time_point deadline,
                          std::string* in, bool* closed) {
  for (;;) {
    int err = 0;
    const Io io = RecvUpTo(fd, in, n, &err);
    if (io == Io::kDone) return "";
    if (io == Io::kClosed) {
      *closed = true;
      return "closed";
    }
    if (io == Io::kError) {
      return absl::StrCat("reading the handshake failed: ", strerror(err));
    }
    if (!PollUntil(fd, POLLIN, deadline)) {
      return "it did not answer the handshake in time";
    }
  }
}

// Blocking socket I/O of the data path; false with `*err` (0: closed).
bool ReadFull(int fd, char* p, size_t n, int* err) {
  while (n > 0) {
    const ssize_t got = ::recv(fd, p, n, MSG_WAITALL);
    if (got < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return false;
    }
    if (got == 0) {
      *err = 0;
      return false;
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

}  // namespace tcp_internal
}  // namespace gradd
