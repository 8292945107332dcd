// What the engine needs from trainer sessions (common/session.h): whether a
// session is alive, and a way to hand a rank its file descriptors. The real
// implementation is server/session_listener.h; tests use FakeSessionRegistry
// (tests/unit/engine/manager/fake_session_registry.h).
#ifndef GRADD_SERVER_ENGINE_MANAGER_SESSION_REGISTRY_H_
#define GRADD_SERVER_ENGINE_MANAGER_SESSION_REGISTRY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace gradd {

// Implementations are thread-safe.
class SessionRegistryInterface {
 public:
  virtual ~SessionRegistryInterface() = default;

  // True while the trainer's session socket is connected.
  virtual bool IsLive(uint64_t session_id) const = 0;

  // IsLive, and marks the session as used by an Attach, so the registry
  // does not close it as idle. The default suits registries without idle
  // timeouts.
  virtual bool Claim(uint64_t session_id) { return IsLive(session_id); }

  // Undoes Claim: the Attach that claimed the session failed or was
  // cancelled, so the session is idle again and the idle timeout runs
  // from now (a trainer may retry on it meanwhile). No-op for an unknown
  // session and by default.
  virtual void Unclaim(uint64_t session_id) {}

  // Sends SessionFds{attach_id} with `fds` (SCM_RIGHTS; duplicated into the
  // peer, the caller keeps its own) on the session's socket. UNAVAILABLE if
  // the session is gone.
  [[nodiscard]] virtual absl::Status SendFds(uint64_t session_id,
                                             uint64_t attach_id,
                                             const std::vector<int>& fds) = 0;
};

// Told when a session's socket closes (the trainer exited, crashed or
// closed it). Called on the registry's thread; implementations must not
// block (post the work to their own thread).
class SessionObserverInterface {
 public:
  virtual ~SessionObserverInterface() = default;
  virtual void OnSessionClosed(uint64_t session_id) = 0;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_MANAGER_SESSION_REGISTRY_H_
