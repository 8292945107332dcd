// Which daemons a trainer talks to. Before a trainer sends anything (job id,
// parameter names) it checks who serves the socket it found: a daemon that
// runs as root, as the trainer's own uid, or as the uid the user named
// (ClientOptions::daemon_uid or $GRADD_DAEMON_UID). Anyone else may have
// planted a socket at the default path (/tmp/gradd-UID is guessable), so the
// trainer refuses it with PERMISSION_DENIED naming both uids.
//
// Both of the daemon's sockets are checked, by SO_PEERCRED on the connected
// socket: the session socket the trainer keeps, and the gRPC socket through a
// probe connection just before the channel is made; both must be the same
// process. (The probe and gRPC's own connection are two connects; the socket
// directory's 0700 mode is what keeps another user from swapping the file in
// between.)
#ifndef GRADD_CLIENT_SRC_SESSION_DAEMON_PEER_H_
#define GRADD_CLIENT_SRC_SESSION_DAEMON_PEER_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/session.h"

namespace gradd {

// The uid the user trusts besides root and itself: `option` if set, else
// $GRADD_DAEMON_UID (INVALID_ARGUMENT if that is not a uid), else none.
absl::StatusOr<std::optional<uid_t>> TrustedDaemonUid(
    std::optional<uint32_t> option);

// OK if `peer` may serve this trainer; PERMISSION_DENIED naming the socket,
// the daemon's uid and pid and the trainer's uid otherwise.
absl::Status CheckDaemonPeer(const PeerIdentity& peer,
                             const std::string& socket_path,
                             std::optional<uid_t> trusted);

// Connects once to the gRPC socket at `socket_path` (SOCK_STREAM), returns
// who serves it and closes the probe.
absl::StatusOr<PeerIdentity> ProbeStreamSocketPeer(
    const std::string& socket_path);

}  // namespace gradd

#endif  // GRADD_CLIENT_SRC_SESSION_DAEMON_PEER_H_
