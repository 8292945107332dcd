// The daemon's AdminSourceInterface: the JobManager's snapshots and ping,
// with each attached rank's pid and uid looked up in the session listener.
//
// Timeline and stalls: the engine's timeline ring and stall inspector
// (JobManager::Timeline / JobManager::Stalls over server/engine/
// job_events.h) come with the metrics component; until they are connected
// here, JobTimeline and JobStalls answer an empty list with a note saying
// so. ToTraceEvent / ToStall below convert the engine's structs (any type
// with their field names) to the admin protos, ready for that connection.
//
// Threads: any (JobManager and SessionListener are thread-safe).
#ifndef GRADD_SERVER_ADMIN_JOB_MANAGER_SOURCE_H_
#define GRADD_SERVER_ADMIN_JOB_MANAGER_SOURCE_H_

#include <string>
#include <vector>

#include "server/admin/admin_source.h"
#include "server/engine/job_manager.h"
#include "server/session_listener.h"

namespace gradd {

// engine/job_events.h's TimelineEvent {iteration, bucket, local_rank,
// phase, start_unix_ns, duration_ns} as the admin proto carries it.
template <typename Event>
v1::TraceEvent ToTraceEvent(const Event& e) {
  v1::TraceEvent out;
  out.set_iteration(e.iteration);
  out.set_bucket(e.bucket);
  out.set_local_rank(e.local_rank);
  out.set_phase(e.phase);
  out.set_start_unix_ns(e.start_unix_ns);
  out.set_duration_ns(e.duration_ns);
  return out;
}

// engine/job_events.h's StallReport {job_id, iteration, bucket,
// waited_seconds, missing_local_ranks, missing_nodes, unready_parameters}.
template <typename Report>
v1::Stall ToStall(const Report& r) {
  v1::Stall out;
  out.set_job_id(r.job_id);
  out.set_iteration(r.iteration);
  out.set_bucket(r.bucket);
  out.set_waited_seconds(r.waited_seconds);
  for (int rank : r.missing_local_ranks) out.add_missing_local_ranks(rank);
  for (const auto& node : r.missing_nodes) out.add_missing_nodes(node);
  for (const auto& p : r.unready_parameters) out.add_unready_parameters(p);
  return out;
}

class JobManagerAdminSource final : public AdminSourceInterface {
 public:
  // Both must outlive this object; `sessions` may be null (no pids).
  JobManagerAdminSource(JobManager* manager, const SessionListener* sessions)
      : manager_(manager), sessions_(sessions) {}

  absl::StatusOr<std::vector<JobSnapshot>> Jobs(
      absl::Time deadline, bool detail, const std::string* job_id) override;
  absl::Status Ping(absl::Time deadline) override;
  size_t NumSessions() const override;
  absl::StatusOr<Timeline> JobTimeline(const std::string& job_id) override;
  absl::StatusOr<Stalls> JobStalls(const std::string& job_id) override;

 private:
  JobManager* const manager_;
  const SessionListener* const sessions_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ADMIN_JOB_MANAGER_SOURCE_H_
