#include "server/rpc/caller_check.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/session.h"
#include "server/rpc/unix_acceptor.h"
#include "server/session_listener.h"

namespace gradd {

absl::Status SessionCallerCheck::Check(absl::string_view grpc_peer,
                                       uint64_t session_id) const {
  const std::optional<PeerIdentity> session = sessions_->PeerOf(session_id);
  if (!session.has_value()) return absl::OkStatus();  // the handler says why
  const std::optional<PeerIdentity> caller = rpc_->PeerOf(grpc_peer);
  if (!caller.has_value()) {
    return absl::PermissionDeniedError(
        absl::StrCat("session ", session_id,
                     " may be used only through the daemon's own "
                     "socket (this call came from '",
                     grpc_peer, "')"));
  }
  if (caller->pid != session->pid || caller->uid != session->uid) {
    return absl::PermissionDeniedError(absl::StrCat(
        "session ", session_id, " belongs to pid ", session->pid, " (uid ",
        session->uid, "); this call came from pid ", caller->pid, " (uid ",
        caller->uid, "); a trainer acts only for its own session"));
  }
  return absl::OkStatus();
}

}  // namespace gradd
