// Binds the Node calls that act for a trainer's session (Attach, Detach,
// RebuildBuckets) to the process that owns the session: the gRPC
// connection a call arrives on must have been opened by the same process
// (pid and uid, SO_PEERCRED) as the session socket whose id it names. A
// session id is random and sent only to its own connection, so guessing one
// is hopeless anyway; this closes the rest: a process that learned another's
// id (e.g. from its logs) still cannot attach or detach in its place.
//
// Threads: Check runs on gRPC threads; both sources are thread-safe.
#ifndef GRADD_SERVER_RPC_CALLER_CHECK_H_
#define GRADD_SERVER_RPC_CALLER_CHECK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gradd {

class SessionListener;
class UnixAcceptor;

class CallerCheckInterface {
 public:
  virtual ~CallerCheckInterface() = default;
  // OK if the call whose ServerContext::peer() is `grpc_peer` may act for
  // session `session_id`; PERMISSION_DENIED naming both processes if not.
  // An unknown session is left to the handler (it names the problem).
  virtual absl::Status Check(absl::string_view grpc_peer,
                             uint64_t session_id) const = 0;
};

// The daemon's check: the connection's credentials as UnixAcceptor recorded
// them against the session's as SessionListener did. Both must outlive it.
class SessionCallerCheck final : public CallerCheckInterface {
 public:
  SessionCallerCheck(const UnixAcceptor* rpc, const SessionListener* sessions)
      : rpc_(rpc), sessions_(sessions) {}
  absl::Status Check(absl::string_view grpc_peer,
                     uint64_t session_id) const override;

 private:
  const UnixAcceptor* const rpc_;
  const SessionListener* const sessions_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_RPC_CALLER_CHECK_H_
