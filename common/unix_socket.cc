#include "common/unix_socket.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gradd {

absl::Status ErrnoUnavailable(absl::string_view what, absl::string_view path) {
  return absl::UnavailableError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

std::optional<sockaddr_un> UnixAddress(absl::string_view path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return std::nullopt;
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

absl::StatusOr<UniqueFd> UnixSocket(int type) {
  UniqueFd fd(socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("socket(AF_UNIX) failed: ", std::strerror(errno)));
  }
  return fd;
}

int ConnectUnix(int fd, const sockaddr_un& addr) {
  int r;
  do {
    r = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  } while (r != 0 && errno == EINTR);
  return r == 0 ? 0 : errno;
}

absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, int type,
                                    mode_t mode, absl::string_view what) {
  const std::optional<sockaddr_un> addr = UnixAddress(path);
  if (!addr.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " path too long: ", path));
  }
  UniqueFd fd(socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoUnavailable("socket() for", path);
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&*addr),
           sizeof(*addr)) != 0) {
    return ErrnoUnavailable(absl::StrCat("cannot bind ", what), path);
  }
  // bind() leaves the file with the umask's mode; set ours before anyone
  // can connect (listeners check SO_PEERCRED again at accept).
  if (chmod(path.c_str(), mode) != 0) return ErrnoUnavailable("chmod", path);
  if (listen(fd.get(), 128) != 0) return ErrnoUnavailable("listen on", path);
  return fd;
}

}  // namespace gradd
