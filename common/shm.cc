#include "common/shm.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradd {
namespace {

absl::Status ErrnoError(int err, std::string_view what) {
  std::string message =
      absl::StrCat(std::string(what), ": ", std::strerror(err));
  switch (err) {
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case ENOSPC:
      return absl::ResourceExhaustedError(message);
    case EPIPE:
    case ECONNRESET:
    case ENOTCONN:
      return absl::UnavailableError(message);
    case EBADF:
    case EINVAL:
    case ENOTSOCK:
      return absl::InvalidArgumentError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace

UniqueFd::UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

UniqueFd::~UniqueFd() { reset(); }

int UniqueFd::release() { return std::exchange(fd_, -1); }

void UniqueFd::reset(int fd) {
  // close() errors are not actionable here; on Linux the fd is gone even on
  // EINTR, so retrying would risk closing someone else's fd.
  if (fd_ >= 0 && fd_ != fd) ::close(fd_);
  fd_ = fd;
}

absl::StatusOr<Mapping> Mapping::Map(int fd, size_t size) {
  if (size == 0) return absl::InvalidArgumentError("cannot map 0 bytes");
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return ErrnoError(
        errno, absl::StrCat("mmap of ", size, " bytes of fd ", fd, " failed"));
  }
  return Mapping(p, size);
}

Mapping::Mapping(Mapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Mapping::~Mapping() {
  if (data_ != nullptr) munmap(data_, size_);
}

namespace {

absl::StatusOr<UniqueFd> CreateMemfd(std::string_view name, size_t size,
                                     int seals) {
  // The name only shows up in /proc/<pid>/fd links; memfd_create limits it
  // to 249 bytes.
  std::string n(name.substr(0, 200));
  UniqueFd fd(memfd_create(n.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) {
    return ErrnoError(errno, absl::StrCat("memfd_create(", n, ") failed"));
  }
  if (ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return ErrnoError(errno, absl::StrCat("ftruncate of memfd ", n, " to ",
                                          size, " bytes failed"));
  }
  // Sealed so no process holding the fd can shrink it (a later access to
  // the mapping past the new end would SIGBUS the daemon) or grow it.
  if (fcntl(fd.get(), F_ADD_SEALS, seals) != 0) {
    return ErrnoError(errno, absl::StrCat("sealing memfd ", n, " failed"));
  }
  return fd;
}

}  // namespace

absl::StatusOr<UniqueFd> CreateSealedMemfd(std::string_view name, size_t size) {
  return CreateMemfd(name, size, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
}

absl::StatusOr<UniqueFd> CreateMemfdForSealing(std::string_view name,
                                               size_t size) {
  return CreateMemfd(name, size, F_SEAL_SHRINK | F_SEAL_GROW);
}

absl::Status SealReadOnlyForOthers(int fd) {
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    const int err = errno;
    if (err == EINVAL) {
      return absl::FailedPreconditionError(
          "this kernel cannot seal a memfd against future writes "
          "(F_SEAL_FUTURE_WRITE needs Linux >= 5.1); gradd needs it to keep "
          "trainers from writing the daemon's control state");
    }
    return ErrnoError(
        err, absl::StrCat("F_SEAL_FUTURE_WRITE on fd ", fd, " failed"));
  }
  return absl::OkStatus();
}

absl::Status CheckSealedMemfd(int fd, size_t size) {
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    // EINVAL: not a memfd (or created without MFD_ALLOW_SEALING).
    return absl::InvalidArgumentError(absl::StrCat(
        "fd ", fd, " is not a sealable memfd: ", std::strerror(errno)));
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memfd ", fd, " is not sealed against shrinking"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return ErrnoError(errno, absl::StrCat("fstat of fd ", fd, " failed"));
  }
  if (static_cast<uint64_t>(st.st_size) < size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memfd ", fd, " holds ", st.st_size, " bytes, ", size, " expected"));
  }
  return absl::OkStatus();
}

absl::Status SendWithFds(int socket_fd, std::string_view payload,
                         const std::vector<int>& fds) {
  // Linux limits SCM_RIGHTS to 253 fds per message.
  constexpr size_t kMaxFds = 253;
  if (fds.size() > kMaxFds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot pass ", fds.size(), " fds in one message (max ", kMaxFds, ")"));
  }
  // A message carrying fds needs at least one byte of payload, or the
  // ancillary data is not delivered on a stream socket.
  char zero = 0;
  struct iovec iov;
  iov.iov_base = payload.empty() ? &zero : const_cast<char*>(payload.data());
  iov.iov_len = payload.empty() ? 1 : payload.size();

  std::vector<char> control;
  struct msghdr msg;
  std::memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    control.resize(CMSG_SPACE(sizeof(int) * fds.size()));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }

  while (true) {
    // MSG_NOSIGNAL: a closed peer must be an error, not a SIGPIPE that kills
    // the daemon (or the trainer).
    ssize_t n = sendmsg(socket_fd, &msg, MSG_NOSIGNAL);
    if (n >= 0) {
      if (static_cast<size_t>(n) != iov.iov_len) {
        // Only a stream socket can take part of a message; the fds went with
        // the first byte, and the rest is too large to finish sensibly.
        return absl::InternalError(absl::StrCat("short send on fd ", socket_fd,
                                                ": ", n, " of ", iov.iov_len,
                                                " bytes"));
      }
      return absl::OkStatus();
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      // Non-blocking socket with a full buffer: wait for room.
      struct pollfd p = {socket_fd, POLLOUT, 0};
      if (poll(&p, 1, -1) < 0 && errno != EINTR) {
        return ErrnoError(errno, "poll for send failed");
      }
      continue;
    }
    return ErrnoError(errno,
                      absl::StrCat("sendmsg on fd ", socket_fd, " failed"));
  }
}

absl::StatusOr<ReceivedMessage> ReceiveWithFds(
    int socket_fd, size_t max_payload, size_t max_fds,
    std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = timeout >= std::chrono::hours(24 * 365)
                                         ? Clock::time_point::max()
                                         : Clock::now() + timeout;

  while (true) {
    int wait_ms = -1;
    if (deadline != Clock::time_point::max()) {
      auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      wait_ms =
          static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT32_MAX));
    }
    struct pollfd p = {socket_fd, POLLIN, 0};
    int r = poll(&p, 1, wait_ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "poll for receive failed");
    }
    if (r == 0) {
      if (Clock::now() < deadline) continue;
      return absl::DeadlineExceededError(
          absl::StrCat("no message on socket fd ", socket_fd, " within ",
                       timeout.count(), " ms"));
    }
    if (p.revents & POLLNVAL) {
      return absl::InvalidArgumentError(
          absl::StrCat("fd ", socket_fd, " is not open"));
    }
    // POLLIN, POLLHUP or POLLERR: recvmsg says which.
    break;
  }

  ReceivedMessage out;
  // At least one byte: SendWithFds turns an empty payload into one NUL byte
  // (fds need a byte to ride on). A message larger than max_payload is
  // reported through MSG_TRUNC on datagram/seqpacket sockets.
  std::string buffer(std::max<size_t>(max_payload, 1), '\0');
  struct iovec iov;
  iov.iov_base = buffer.data();
  iov.iov_len = buffer.size();
  std::vector<char> control(
      CMSG_SPACE(sizeof(int) * std::max<size_t>(max_fds, 1)));
  struct msghdr msg;
  std::memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();

  ssize_t n;
  while (true) {
    // MSG_CMSG_CLOEXEC: received fds must not leak into processes the
    // receiver forks and execs.
    n = recvmsg(socket_fd, &msg, MSG_CMSG_CLOEXEC);
    if (n >= 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      // Spurious readiness on a non-blocking socket; the deadline is not
      // re-armed here because poll just said data was there.
      struct pollfd p = {socket_fd, POLLIN, 0};
      poll(&p, 1, 10);
      continue;
    }
    if (errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN) {
      return absl::UnavailableError(absl::StrCat(
          "peer closed socket fd ", socket_fd, ": ", std::strerror(errno)));
    }
    return ErrnoError(errno,
                      absl::StrCat("recvmsg on fd ", socket_fd, " failed"));
  }

  // Take ownership of every fd first so none leaks on the error paths below.
  for (struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr;
       cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) {
      continue;
    }
    size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
      out.fds.emplace_back(fd);
    }
  }

  if (n == 0) {
    return absl::UnavailableError(
        absl::StrCat("peer closed socket fd ", socket_fd));
  }
  // CMSG_SPACE pads to 8 bytes, so the kernel may deliver one fd more than
  // asked for without setting MSG_CTRUNC; both cases are the same error.
  if ((msg.msg_flags & MSG_CTRUNC) || out.fds.size() > max_fds) {
    return absl::InvalidArgumentError(
        absl::StrCat("message on fd ", socket_fd, " carried more than ",
                     max_fds, " file descriptors"));
  }
  if ((msg.msg_flags & MSG_TRUNC) ||
      (max_payload > 0 && static_cast<size_t>(n) > max_payload) ||
      (max_payload == 0 && (n != 1 || buffer[0] != '\0'))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "message on fd ", socket_fd, " larger than ", max_payload, " bytes"));
  }
  if (max_payload == 0) n = 0;  // The NUL carrier byte of an empty payload.
  buffer.resize(static_cast<size_t>(n));
  out.payload = std::move(buffer);
  return out;
}

}  // namespace gradd
