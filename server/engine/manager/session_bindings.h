// SessionBindings: which trainer session holds which local rank of which
// job on this node, for pending and active jobs alike (job_manager.h). A
// call of a rank (Detach, RebuildBuckets, SetCommHook) acts only through
// the session that attached it, and a session's close is news for the rank
// it holds. One per JobManager.
//
//   free --Bind: an Attach accepted (pending), or a restarting rank's--> bound
//    ^           new Attach (job_manager_restart.cc)                    |
//    +-- Unbind / UnbindRank: detach; an attach withdrawn, timed out,  <-+
//        cancelled or failed; the rank gone; its session closed
//
// A session holds at most one rank and a rank is held by at most one
// session. A bound session stays bound while its job is failed: the rank
// is gone only when the trainer detaches or closes it. What a session's
// close does to its rank is the manager's to decide
// (JobManager::DoSessionClosed): a pending rank is withdrawn, an active
// one restarts when its job has a grace (RankRestartDeadlines) and can
// wait, or else it is gone.
//
// Pure logic, owned by the manager's control thread.
#ifndef GRADD_SERVER_ENGINE_MANAGER_SESSION_BINDINGS_H_
#define GRADD_SERVER_ENGINE_MANAGER_SESSION_BINDINGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"

namespace gradd {

class SessionBindings {
 public:
  // A local rank of a job.
  struct Rank {
    std::string job_id;
    int local_rank = 0;
  };

  // The rank session `session` holds (null: none). Valid until the next
  // change.
  const Rank* Find(uint64_t session) const;
  // The session holding `local_rank` of `job_id` (0: none).
  uint64_t SessionOf(const std::string& job_id, int local_rank) const;
  bool Holds(uint64_t session, const std::string& job_id, int local_rank) const;
  // How many sessions hold a rank.
  size_t size() const { return by_session_.size(); }

  // OK when session `session` holds no rank; else ALREADY_EXISTS naming
  // the rank it holds (each rank needs its own session).
  absl::Status CheckFree(uint64_t session) const;
  // OK when session `session` holds `local_rank` of `job_id`; else
  // NOT_FOUND naming the rank and the session (a call acts only for the
  // rank its session attached).
  absl::Status CheckHolds(uint64_t session, const std::string& job_id,
                          int local_rank) const;

  // Session `session` holds `local_rank` of `job_id` from now on.
  // ALREADY_EXISTS (nothing changed) when the session holds a rank or
  // another session holds that one; INVALID_ARGUMENT for session 0.
  absl::Status Bind(uint64_t session, const std::string& job_id,
                    int local_rank);
  // Frees session `session`; the rank it held (nullopt: none).
  std::optional<Rank> Unbind(uint64_t session);
  // Frees `local_rank` of `job_id`; the session that held it (0: none).
  uint64_t UnbindRank(const std::string& job_id, int local_rank);
  // Frees every session (the manager stops).
  void Clear();

 private:
  absl::flat_hash_map<uint64_t, Rank> by_session_;
  absl::flat_hash_map<std::pair<std::string, int>, uint64_t> by_rank_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_MANAGER_SESSION_BINDINGS_H_
