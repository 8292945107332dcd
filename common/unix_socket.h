// Unix-domain socket plumbing shared by the daemon's listeners (gRPC socket,
// session socket), its stale-socket probe and the client's connectors, so
// path checks, bind/chmod/listen and EINTR handling live in one place.
// Thread-compatible free functions.
#ifndef GRADD_COMMON_UNIX_SOCKET_H_
#define GRADD_COMMON_UNIX_SOCKET_H_

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/shm.h"

namespace gradd {

// The AF_UNIX address of `path`; nullopt when it does not fit sun_path
// (107 bytes plus the NUL). Callers say which path was too long and why.
std::optional<sockaddr_un> UnixAddress(absl::string_view path);

// A socket(AF_UNIX, type | SOCK_CLOEXEC); `type` may carry SOCK_NONBLOCK.
// RESOURCE_EXHAUSTED when the process is out of fds or memory.
absl::StatusOr<UniqueFd> UnixSocket(int type);

// connect()s `fd` to `addr`, retrying on EINTR. Returns 0, or the errno of
// the failed connect (callers decide what is worth retrying).
int ConnectUnix(int fd, const sockaddr_un& addr);

// UNAVAILABLE "<what> <path>: <errno's text>", the error the listeners
// return when a system call fails.
absl::Status ErrnoUnavailable(absl::string_view what, absl::string_view path);

// Binds a new socket of `type` (SOCK_STREAM / SOCK_SEQPACKET, optionally
// | SOCK_NONBLOCK; CLOEXEC is added) to `path`, sets the file's mode to
// `mode` and listens. `what` names the socket in errors ("gRPC socket",
// "session socket"). INVALID_ARGUMENT when `path` is too long, UNAVAILABLE
// (with errno's text) when a system call fails. The caller removed any stale
// file at `path` and unlinks it when done.
absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, int type,
                                    mode_t mode, absl::string_view what);

}  // namespace gradd

#endif  // GRADD_COMMON_UNIX_SOCKET_H_
