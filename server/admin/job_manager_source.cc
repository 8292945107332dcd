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

v1::TraceEvent ToTraceEvent(const TimelineEvent& e) {
  v1::TraceEvent out;
  out.set_iteration(e.iteration);
  out.set_bucket(e.bucket);
  out.set_local_rank(e.local_rank);
  out.set_phase(e.phase);
  out.set_start_unix_ns(e.start_unix_ns);
  out.set_duration_ns(e.duration_ns);
  return out;
}

v1::Stall ToStall(const StallReport& r) {
  v1::Stall out;
  out.set_job_id(r.job_id);
  out.set_iteration(r.iteration);
  out.set_bucket(r.bucket);
  out.set_waited_seconds(r.waited_seconds);
  for (int rank : r.missing_local_ranks) out.add_missing_local_ranks(rank);
  for (const std::string& node : r.missing_nodes) out.add_missing_nodes(node);
  for (const std::string& p : r.unready_parameters) {
    out.add_unready_parameters(p);
  }
  out.set_message(r.message);
  return out;
}

absl::StatusOr<AdminSourceInterface::Timeline>
JobManagerAdminSource::JobTimeline(const std::string& job_id) {
  absl::StatusOr<std::vector<TimelineEvent>> events =
      manager_->Timeline(job_id);
  if (!events.ok()) return events.status();
  Timeline t;
  t.events.reserve(events->size());
  for (const TimelineEvent& e : *events) t.events.push_back(ToTraceEvent(e));
  if (t.events.empty()) {
    t.note = "no bucket events yet (the job has not reduced a bucket)";
  }
  return t;
}

absl::StatusOr<AdminSourceInterface::Stalls> JobManagerAdminSource::JobStalls(
    const std::string& job_id) {
  absl::StatusOr<std::vector<StallReport>> reports = manager_->Stalls(job_id);
  if (!reports.ok()) return reports.status();
  Stalls s;
  for (const StallReport& r : *reports) s.stalls.push_back(ToStall(r));
  return s;
}

}  // namespace gradd
