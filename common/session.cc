#include "common/session.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/client_strings.h"

namespace gradd {

absl::StatusOr<SessionMessage> DecodeSessionMessage(std::string_view payload) {
  // Every message starts with magic and kind.
  uint32_t head[2] = {0, 0};
  if (payload.size() < sizeof(head)) {
    return absl::InternalError(
        absl::StrCat("a ", payload.size(), "-byte session message"));
  }
  std::memcpy(head, payload.data(), sizeof(head));
  if (head[0] != kSessionMagic) {
    return absl::InternalError(
        absl::StrCat("a session message with magic ", head[0], " (",
                     payload.size(), " bytes); gradd's is ", kSessionMagic));
  }
  SessionMessage out;
  switch (static_cast<SessionMessageKind>(head[1])) {
    case SessionMessageKind::kHello: {
      SessionHello hello;
      if (payload.size() != sizeof(hello)) break;
      std::memcpy(&hello, payload.data(), sizeof(hello));
      if (hello.version != kSessionVersion) {
        return absl::InternalError(absl::StrCat(
            "a greeting in session protocol version ", hello.version,
            "; this library speaks version ", kSessionVersion));
      }
      out.kind = SessionMessageKind::kHello;
      out.session_id = hello.session_id;
      return out;
    }
    case SessionMessageKind::kFds: {
      SessionFds fds;
      if (payload.size() != sizeof(fds)) break;
      std::memcpy(&fds, payload.data(), sizeof(fds));
      out.kind = SessionMessageKind::kFds;
      out.attach_id = fds.attach_id;
      return out;
    }
    case SessionMessageKind::kRefused: {
      SessionRefused refused;
      if (payload.size() != sizeof(refused)) break;
      std::memcpy(&refused, payload.data(), sizeof(refused));
      absl::StatusCode code = absl::StatusCode::kUnknown;
      if (refused.code == 0) {
        code = absl::StatusCode::kPermissionDenied;
      } else if (refused.code > 0 &&
                 refused.code <=
                     static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
        code = static_cast<absl::StatusCode>(refused.code);
      }
      const std::string_view reason(
          refused.reason, strnlen(refused.reason, kSessionReasonBytes));
      out.kind = SessionMessageKind::kRefused;
      out.refusal = absl::Status(
          code, EscapeForLog(absl::string_view(reason.data(), reason.size())));
      return out;
    }
  }
  return absl::InternalError(absl::StrCat("a session message of kind ", head[1],
                                          " and ", payload.size(), " bytes"));
}

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
