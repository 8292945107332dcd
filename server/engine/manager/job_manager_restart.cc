// JobManager's side of rank restart (job_manager.h): a restarting rank's
// new Attach checked against its running job and bound, the engine's
// RestartRank answered with the rank's fds, and the grace's expiry. Control
// thread only (the RestartRank's answer is posted back to it).
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/engine/manager/attach_validation.h"
#include "server/engine/manager/job_manager.h"
#include "server/logging.h"

namespace gradd {

void JobManager::DoRestartAttach(ActiveJob& active, v1::AttachRequest request,
                                 std::vector<ParamInfo> params, int device,
                                 AttachCallback done) {
  Job& job = *active.job;
  const std::string id = request.job_id();
  const int rank = request.local_rank();
  const uint64_t sid = request.session_id();
  const std::string who =
      absl::StrCat("local rank ", rank, " of job '", id, "'");
  absl::Status same =
      CompareRestartAttach(id, rank, job.local_world_size(), job.spec().params,
                           job.spec().broadcast_bytes, request, params);
  if (same.ok() && request.has_rank_restart_grace_ms() &&
      request.rank_restart_grace_ms() != active.restarts.grace_ms()) {
    same = absl::InvalidArgumentError(
        absl::StrCat(who, " re-attached asking for rank_restart_grace_ms ",
                     request.rank_restart_grace_ms(), " but the job runs with ",
                     active.restarts.grace_ms()));
  }
  if (same.ok() && rank < static_cast<int>(job.spec().rank_devices.size()) &&
      job.spec().rank_devices[rank] != device) {
    same = absl::InvalidArgumentError(
        absl::StrCat(who, " re-attached on GPU ", device,
                     " but the job's memory for it is on GPU ",
                     job.spec().rank_devices[rank]));
  }
  if (!same.ok()) {
    // The job keeps waiting for the right process, until the grace.
    sessions_->Unclaim(sid);
    std::move(done)(std::move(same));
    return;
  }
  if (absl::Status bound = bindings_.Bind(sid, id, rank); !bound.ok()) {
    sessions_->Unclaim(sid);
    std::move(done)(std::move(bound));
    return;
  }
  // The grace is over for this rank: it is back (the engine takes it at
  // its next safe point).
  active.restarts.Clear(rank);
  job.RestartRank(rank, [this, id, rank, sid, done = std::move(done)](
                            absl::StatusOr<v1::AttachResponse> info) mutable {
    Post([this, id, rank, sid, info = std::move(info),
          done = std::move(done)]() mutable {
      auto it = jobs_.find(id);
      if (it == jobs_.end() || bindings_.SessionOf(id, rank) != sid) {
        if (it == jobs_.end() && bindings_.Holds(sid, id, rank)) Unbind(sid);
        std::move(done)(absl::AbortedError(absl::StrCat(
            "local rank ", rank, " of job '", id,
            "' could not rejoin: the job ended or the rank went away "
            "meanwhile")));
        return;
      }
      if (!info.ok()) {
        // The job failed (or stops): the session stays bound until the
        // trainer closes it, like every rank of a failed job.
        std::move(done)(info.status());
        return;
      }
      Job& job = *it->second.job;
      const uint64_t attach_id = next_attach_id_++;
      if (absl::Status sent =
              sessions_->SendFds(sid, attach_id, job.FdsFor(rank));
          !sent.ok()) {
        // Its session closed meanwhile: OnSessionClosed (posted) makes it
        // restarting again.
        std::move(done)(absl::UnavailableError(
            absl::StrCat("local rank ", rank, " of job '", id,
                         "' disconnected while rejoining: ", sent.message())));
        return;
      }
      v1::AttachResponse resp = *std::move(info);
      resp.set_attach_id(attach_id);
      std::move(done)(std::move(resp));
    });
  });
}

void JobManager::ExpireRestarts(absl::Time now) {
  std::vector<std::pair<std::string, RankRestartDeadlines::Expiry>> expired;
  for (auto& [id, active] : jobs_) {
    if (std::optional<RankRestartDeadlines::Expiry> e =
            active.restarts.Expire(now)) {
      expired.emplace_back(id, *std::move(e));
    }
  }
  for (const auto& [id, expiry] : expired) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    spdlog::error("{}", expiry.status.message());
    it->second.job->Fail(expiry.status.code(), expiry.status.message());
    // Every rank still away is gone (the last one ends the job).
    for (int r : expiry.gone) RankGone(id, r, /*detached=*/false);
  }
}

}  // namespace gradd
