// The daemon's AdminSourceInterface: the JobManager's snapshots and ping,
// with each attached rank's pid and uid looked up in the session listener.
//
// Timeline and stalls: the engine's timeline ring and stall inspector
// (JobManager::Timeline / JobManager::Stalls,
// server/engine/observe/job_events.h).
//
// Threads: any (JobManager and SessionListener are thread-safe).
#ifndef GRADD_SERVER_ADMIN_JOB_MANAGER_SOURCE_H_
#define GRADD_SERVER_ADMIN_JOB_MANAGER_SOURCE_H_

#include <string>
#include <vector>

#include "server/admin/admin_source.h"
#include "server/engine/manager/job_manager.h"
#include "server/engine/observe/job_events.h"
#include "server/session_listener.h"

namespace gradd {

// The engine's timeline event and stall report (engine/observe/job_events.h) as
// the admin protos carry them.
v1::TraceEvent ToTraceEvent(const TimelineEvent& e);
v1::Stall ToStall(const StallReport& r);

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
