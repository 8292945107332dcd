// The daemon's session socket (<socket>.session, SOCK_SEQPACKET; protocol in
// common/session.h). Owns the listening socket and every trainer's session
// socket; one thread polls them all, so a trainer's death (its socket
// closing) is seen within milliseconds and reported to the observer.
//
// Threads: Start() spawns the poll thread; IsLive/Claim/SendFds are called
// from the job manager's thread; Stop() from the owner.
//
// Nothing a peer does can wedge it:
// - peers whose uid is neither ours nor root (SO_PEERCRED) are refused at
//   accept with a SessionRefused message saying why;
// - at most Options::max_sessions sessions, max_sessions_per_uid per uid
//   and max_sessions_per_process per process (pid, SO_PEERCRED): beyond
//   that a connection is refused (RESOURCE_EXHAUSTED), so idle connections
//   cannot use up the daemon's file descriptors, and one process cannot
//   hold all of its uid's sessions. A peer whose pid the daemon cannot see
//   (SO_PEERCRED says 0: another pid namespace) is not capped per process;
// - when a uid is at its cap, a connection from another process of that
//   uid first closes the uid's oldest idle session (no Attach using it)
//   that has been idle for kReapAfter, so sessions parked by one process
//   do not lock the uid's other trainers out until idle_timeout;
// - a session that no Attach claims within idle_timeout is closed;
// - when accept() fails for want of resources (EMFILE, ENFILE, ENOBUFS,
//   ENOMEM) the listener stops polling the listening socket for
//   kAcceptBackoff instead of spinning on it, and resumes by itself;
// - session ids are random 62-bit values (getrandom), so one trainer cannot
//   guess another's.
#ifndef GRADD_SERVER_SESSION_LISTENER_H_
#define GRADD_SERVER_SESSION_LISTENER_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/session.h"
#include "common/shm.h"
#include "server/engine/manager/session_registry.h"

namespace gradd {

class SessionListener final : public SessionRegistryInterface {
 public:
  struct Options {
    uint32_t max_sessions = 1024;
    uint32_t max_sessions_per_uid = 256;
    uint32_t max_sessions_per_process = 128;
    std::chrono::milliseconds idle_timeout{30000};
  };
  static constexpr std::chrono::milliseconds kAcceptBackoff{100};
  // An idle session younger than this is never closed to make room: a
  // trainer sends its Attach within milliseconds of the hello.
  static constexpr std::chrono::milliseconds kReapAfter{1000};

  // Binds and listens on `path` (mode 0600). The caller has removed any stale
  // file. Errors: UNAVAILABLE/INTERNAL from socket calls, naming the path.
  static absl::StatusOr<std::unique_ptr<SessionListener>> Create(
      const std::string& path, const Options& options);
  ~SessionListener() override;

  // Starts accepting and watching. `observer` must outlive Stop().
  void Start(SessionObserverInterface* observer);
  // Stops the thread and closes every socket (trainers see the close).
  // Unlinks the socket file. Idempotent.
  void Stop();

  bool IsLive(uint64_t session_id) const override;
  bool Claim(uint64_t session_id) override;
  void Unclaim(uint64_t session_id) override;
  // Who connected session `session_id` (SO_PEERCRED at accept); nullopt
  // once it is closed. Any thread.
  std::optional<PeerIdentity> PeerOf(uint64_t session_id) const;
  // Open sessions (claimed or not). Any thread.
  size_t num_sessions() const;
  absl::Status SendFds(uint64_t session_id, uint64_t attach_id,
                       const std::vector<int>& fds) override;

  const std::string& path() const { return path_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Session {
    UniqueFd fd;
    uid_t uid = 0;
    pid_t pid = 0;
    bool claimed = false;
    // Accepted, or last given back by the engine (Unclaim): the idle
    // timeout counts from here.
    Clock::time_point idle_since;
  };

  SessionListener(std::string path, UniqueFd listen_fd, UniqueFd wake_fd,
                  const Options& options);
  void Loop();
  // Accepts one connection; false if accept failed for want of resources.
  // Sessions it closed to make room go to `closed`.
  bool Accept(std::vector<uint64_t>* closed);
  // Uid `uid` is at its cap and process `pid` of it asks for a session:
  // closes the uid's oldest session of another process that no Attach
  // uses and that is idle for kReapAfter; its id, or 0 if none.
  uint64_t ReapIdle(uid_t uid, pid_t pid, Clock::time_point now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes session `it` and its counts.
  void Erase(absl::flat_hash_map<uint64_t, Session>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes unclaimed sessions past idle_timeout; returns the ids closed and
  // the time of the next expiry (Clock::time_point::max() if none).
  std::vector<uint64_t> ExpireIdle(Clock::time_point now,
                                   Clock::time_point* next)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t NewSessionId() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd that interrupts poll() for Stop()
  std::thread thread_;
  SessionObserverInterface* observer_ = nullptr;

  const Options options_;
  // Poll thread only: accept() is paused until then (resource exhaustion).
  Clock::time_point accept_paused_until_{};

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uid_t, uint32_t> per_uid_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<pid_t, uint32_t> per_pid_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradd

#endif  // GRADD_SERVER_SESSION_LISTENER_H_
