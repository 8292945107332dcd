#include "client/src/daemon_peer.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/shm.h"

namespace gradd {

absl::StatusOr<std::optional<uid_t>> TrustedDaemonUid(
    std::optional<uint32_t> option) {
  if (option.has_value()) return std::optional<uid_t>(*option);
  const char* env = std::getenv("GRADD_DAEMON_UID");
  if (env == nullptr || *env == '\0') return std::optional<uid_t>();
  uint32_t uid = 0;
  if (!absl::SimpleAtoi(env, &uid)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GRADD_DAEMON_UID='", env, "' is not a numeric uid"));
  }
  return std::optional<uid_t>(uid);
}

absl::Status CheckDaemonPeer(const PeerIdentity& peer,
                             const std::string& socket_path,
                             std::optional<uid_t> trusted) {
  const uid_t me = geteuid();
  if (peer.uid == 0 || peer.uid == me ||
      (trusted.has_value() && peer.uid == *trusted)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "the gradd socket ", socket_path, " is served by uid ", peer.uid,
      " (pid ", peer.pid, "), but this trainer runs as uid ", me,
      " and trusts only root, itself",
      trusted.has_value() ? absl::StrCat(" and uid ", *trusted) : "",
      "; refusing to send it anything (set GRADD_DAEMON_UID=", peer.uid,
      " if that daemon is yours)"));
}

absl::StatusOr<PeerIdentity> ProbeStreamSocketPeer(
    const std::string& socket_path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradd socket path '", socket_path, "' is too long"));
  }
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("socket(AF_UNIX) failed: ", std::strerror(errno)));
  }
  int r;
  do {
    r = connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (r != 0 && errno == EINTR);
  if (r != 0) {
    return absl::UnavailableError(
        absl::StrCat("gradd's gRPC socket ", socket_path,
                     " does not accept: ", std::strerror(errno)));
  }
  return SocketPeer(fd.get());
}

}  // namespace gradd
