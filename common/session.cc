#include "common/session.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gradd {

absl::StatusOr<PeerIdentity> SocketPeer(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return absl::InternalError(
        absl::StrCat("SO_PEERCRED failed: ", std::strerror(errno)));
  }
  return PeerIdentity{cred.pid, cred.uid};
}

std::string DefaultSocketPath() {
  if (geteuid() == 0) return "/run/gradd/gradd.sock";
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg && *xdg) {
    return absl::StrCat(xdg, "/gradd/gradd.sock");
  }
  return absl::StrCat("/tmp/gradd-", geteuid(), "/gradd.sock");
}

std::string ClientSocketPath() {
  if (const char* env = std::getenv("GRADD_SOCKET"); env && *env) return env;
  return DefaultSocketPath();
}

std::string SessionSocketPath(std::string_view socket_path) {
  return absl::StrCat(std::string(socket_path), ".session");
}

}  // namespace gradd
