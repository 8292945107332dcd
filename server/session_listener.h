// The daemon's session socket (<socket>.session, SOCK_SEQPACKET; protocol in
// common/session.h). Owns the listening socket and every trainer's session
// socket; one thread polls them all, so a trainer's death (its socket
// closing) is seen within milliseconds and reported to the observer.
//
// Threads: Start() spawns the poll thread; IsLive/SendFds are called from the
// job manager's thread; Stop() from the owner. Peers whose uid is neither ours
// nor root (SO_PEERCRED) are refused at accept.
#ifndef GRADD_SERVER_SESSION_LISTENER_H_
#define GRADD_SERVER_SESSION_LISTENER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/shm.h"
#include "server/engine/session_registry.h"

namespace gradd {

class SessionListener final : public SessionRegistryInterface {
 public:
  // Binds and listens on `path` (mode 0600). The caller has removed any stale
  // file. Errors: UNAVAILABLE/INTERNAL from socket calls, naming the path.
  static absl::StatusOr<std::unique_ptr<SessionListener>> Create(
      const std::string& path);
  ~SessionListener() override;

  // Starts accepting and watching. `observer` must outlive Stop().
  void Start(SessionObserverInterface* observer);
  // Stops the thread and closes every socket (trainers see the close).
  // Unlinks the socket file. Idempotent.
  void Stop();

  bool IsLive(uint64_t session_id) const override;
  absl::Status SendFds(uint64_t session_id, uint64_t attach_id,
                       const std::vector<int>& fds) override;

  const std::string& path() const { return path_; }

 private:
  SessionListener(std::string path, UniqueFd listen_fd, UniqueFd wake_fd,
                  uint64_t first_id);
  void Loop();
  void Accept();

  const std::string path_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd that interrupts poll() for Stop()
  std::thread thread_;
  SessionObserverInterface* observer_ = nullptr;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, UniqueFd> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradd

#endif  // GRADD_SERVER_SESSION_LISTENER_H_
