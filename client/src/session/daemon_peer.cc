#include "client/src/session/daemon_peer.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/shm.h"
#include "common/unix_socket.h"

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
  const std::optional<sockaddr_un> addr = UnixAddress(socket_path);
  if (!addr.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradd socket path '", socket_path, "' is too long"));
  }
  absl::StatusOr<UniqueFd> fd = UnixSocket(SOCK_STREAM);
  if (!fd.ok()) return fd.status();
  if (const int e = ConnectUnix(fd->get(), *addr); e != 0) {
    return absl::UnavailableError(
        absl::StrCat("gradd's gRPC socket ", socket_path,
                     " does not accept: ", std::strerror(e)));
  }
  return SocketPeer(fd->get());
}

}  // namespace gradd
