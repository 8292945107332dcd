// Daemon socket paths and the session-socket protocol.
//
// Next to its gRPC socket <path> the daemon listens on <path>.session
// (SOCK_SEQPACKET). A trainer connects there first; the daemon greets it with
// a SessionHello carrying a fresh session id, which the trainer passes in
// AttachRequest.session_id. When Attach succeeds the daemon sends one
// SessionFds message with SCM_RIGHTS [job block memfd (sealed against
// writes), rank memory memfd, rank control block memfd, write end of the
// rank's bell pipe] (common/control_block.h) before the RPC returns. The
// connection stays open for the life of the rank: the daemon sees a trainer's
// death as the socket closing, so nothing is left behind and nobody waits for a
// dead rank. The daemon checks the peer's uid (SO_PEERCRED) against its own (or
// root).
#ifndef GRADD_COMMON_SESSION_H_
#define GRADD_COMMON_SESSION_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace gradd {

inline constexpr uint32_t kSessionMagic = 0x53445247;  // "GRDS"
inline constexpr uint32_t kSessionVersion = 1;

enum class SessionMessageKind : uint32_t { kHello = 1, kFds = 2, kRefused = 3 };

struct SessionHello {
  uint32_t magic = kSessionMagic;
  uint32_t kind = static_cast<uint32_t>(SessionMessageKind::kHello);
  uint32_t version = kSessionVersion;
  uint32_t reserved = 0;
  uint64_t session_id = 0;
};

// Sent instead of the hello to a peer the daemon will not serve (wrong uid,
// too many sessions), just before it closes the connection, so the trainer
// can say why (PERMISSION_DENIED / RESOURCE_EXHAUSTED) instead of "peer
// closed the socket".
inline constexpr size_t kSessionReasonBytes = 480;
struct SessionRefused {
  uint32_t magic = kSessionMagic;
  uint32_t kind = static_cast<uint32_t>(SessionMessageKind::kRefused);
  uint32_t version = kSessionVersion;
  int32_t code = 0;                       // absl::StatusCode
  char reason[kSessionReasonBytes] = {};  // NUL-terminated
};

struct SessionFds {
  uint32_t magic = kSessionMagic;
  uint32_t kind = static_cast<uint32_t>(SessionMessageKind::kFds);
  uint64_t attach_id = 0;
  // Followed by four fds: job block, rank bucket memory, rank block, bell.
};

// One message the daemon sent on the session socket, decoded and checked.
struct SessionMessage {
  SessionMessageKind kind = SessionMessageKind::kHello;
  uint64_t session_id = 0;  // kHello
  uint64_t attach_id = 0;   // kFds
  // kRefused: the status the refusal carries (never OK).
  absl::Status refusal;
};

// Decodes `payload`, one message as the client receives it. A hello must
// speak kSessionVersion. A refusal becomes the status it carries: its code
// (PERMISSION_DENIED for 0, UNKNOWN for a number that is no status code) and
// its reason up to the first NUL, escaped (EscapeForLog,
// common/client_strings.h: the text comes from the peer and trainers print
// it). Anything else (size, magic, kind, version) is INTERNAL saying what
// arrived. Pure; the session-socket fuzz target (tests/fuzz/) runs it.
absl::StatusOr<SessionMessage> DecodeSessionMessage(std::string_view payload);

// Who is at the other end of a connected Unix socket (SO_PEERCRED), as the
// reading process's pid namespace sees it.
struct PeerIdentity {
  pid_t pid = 0;
  uid_t uid = 0;
};
absl::StatusOr<PeerIdentity> SocketPeer(int fd);

// /run/gradd/gradd.sock as root; else $XDG_RUNTIME_DIR/gradd/gradd.sock when
// set; else /tmp/gradd-<uid>/gradd.sock.
std::string DefaultSocketPath();
// $GRADD_SOCKET if set, else DefaultSocketPath().
std::string ClientSocketPath();
std::string SessionSocketPath(std::string_view socket_path);

}  // namespace gradd

#endif  // GRADD_COMMON_SESSION_H_
