#include "server/engine/manager/session_bindings.h"

#include "absl/strings/str_cat.h"

namespace gradd {

const SessionBindings::Rank* SessionBindings::Find(uint64_t session) const {
  auto it = by_session_.find(session);
  return it == by_session_.end() ? nullptr : &it->second;
}

uint64_t SessionBindings::SessionOf(const std::string& job_id,
                                    int local_rank) const {
  auto it = by_rank_.find(std::make_pair(job_id, local_rank));
  return it == by_rank_.end() ? 0 : it->second;
}

bool SessionBindings::Holds(uint64_t session, const std::string& job_id,
                            int local_rank) const {
  const Rank* rank = Find(session);
  return rank != nullptr && rank->job_id == job_id &&
         rank->local_rank == local_rank;
}

absl::Status SessionBindings::CheckFree(uint64_t session) const {
  const Rank* rank = Find(session);
  if (rank == nullptr) return absl::OkStatus();
  return absl::AlreadyExistsError(
      absl::StrCat("session ", session, " is already attached as local rank ",
                   rank->local_rank, " of job '", rank->job_id,
                   "'; each rank needs its own session"));
}

absl::Status SessionBindings::CheckHolds(uint64_t session,
                                         const std::string& job_id,
                                         int local_rank) const {
  if (Holds(session, job_id, local_rank)) return absl::OkStatus();
  return absl::NotFoundError(
      absl::StrCat("local rank ", local_rank, " of job '", job_id,
                   "' is not attached through session ", session));
}

absl::Status SessionBindings::Bind(uint64_t session, const std::string& job_id,
                                   int local_rank) {
  if (session == 0) {
    return absl::InvalidArgumentError("session id 0 is no session");
  }
  if (absl::Status free = CheckFree(session); !free.ok()) return free;
  if (uint64_t holder = SessionOf(job_id, local_rank); holder != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("local rank ", local_rank, " of job '", job_id,
                     "' is already attached (session ", holder, ")"));
  }
  by_session_[session] = Rank{job_id, local_rank};
  by_rank_[std::make_pair(job_id, local_rank)] = session;
  return absl::OkStatus();
}

std::optional<SessionBindings::Rank> SessionBindings::Unbind(uint64_t session) {
  auto it = by_session_.find(session);
  if (it == by_session_.end()) return std::nullopt;
  Rank rank = std::move(it->second);
  by_session_.erase(it);
  by_rank_.erase(std::make_pair(rank.job_id, rank.local_rank));
  return rank;
}

uint64_t SessionBindings::UnbindRank(const std::string& job_id,
                                     int local_rank) {
  auto it = by_rank_.find(std::make_pair(job_id, local_rank));
  if (it == by_rank_.end()) return 0;
  const uint64_t session = it->second;
  by_rank_.erase(it);
  by_session_.erase(session);
  return session;
}

void SessionBindings::Clear() {
  by_session_.clear();
  by_rank_.clear();
}

}  // namespace gradd
