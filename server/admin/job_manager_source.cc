#include "server/admin/job_manager_source.h"

namespace gradd {

absl::StatusOr<std::vector<JobSnapshot>> JobManagerAdminSource::Jobs(
    absl::Time deadline, bool detail, const std::string* job_id) {
  absl::StatusOr<std::vector<JobSnapshot>> jobs =
      manager_->Snapshot(deadline, detail, job_id);
  if (!jobs.ok() || sessions_ == nullptr) return jobs;
  for (JobSnapshot& job : *jobs) {
    for (RankSnapshot& rank : job.ranks) {
      if (rank.session_id == 0) continue;
      if (std::optional<PeerIdentity> peer = sessions_->PeerOf(rank.session_id);
          peer.has_value()) {
        rank.pid = peer->pid;
        rank.uid = peer->uid;
      }
    }
  }
  return jobs;
}

absl::Status JobManagerAdminSource::Ping(absl::Time deadline) {
  return manager_->Ping(deadline);
}

size_t JobManagerAdminSource::NumSessions() const {
  return sessions_ != nullptr ? sessions_->num_sessions() : 0;
}

// TODO(merge with the metrics component): return the engine's events,
//   ASSIGN_OR_RETURN(auto events, manager_->Timeline(job_id));
//   for (const TimelineEvent& e : events) t.events.push_back(ToTraceEvent(e));
absl::StatusOr<AdminSourceInterface::Timeline>
JobManagerAdminSource::JobTimeline(const std::string& job_id) {
  Timeline t;
  t.note =
      "this daemon records no timeline yet (the engine's timeline ring is "
      "not connected to the admin service in this build)";
  return t;
}

// TODO(merge with the metrics component): manager_->Stalls(job_id), each
// through ToStall.
absl::StatusOr<AdminSourceInterface::Stalls> JobManagerAdminSource::JobStalls(
    const std::string& job_id) {
  Stalls s;
  s.note =
      "this daemon has no stall inspector yet (not connected to the admin "
      "service in this build)";
  return s;
}

}  // namespace gradd
