// In-memory AdminSourceInterface for the admin handler's tests: the test
// sets the jobs, the ping's answer, the timeline and stalls, and reads back
// the deadlines the handler passed.
#ifndef GRADD_TESTS_UNIT_ADMIN_FAKE_ADMIN_SOURCE_H_
#define GRADD_TESTS_UNIT_ADMIN_FAKE_ADMIN_SOURCE_H_

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/admin/admin_source.h"

namespace gradd {

class FakeAdminSource final : public AdminSourceInterface {
 public:
  absl::StatusOr<std::vector<JobSnapshot>> Jobs(
      absl::Time deadline, bool detail, const std::string* job_id) override {
    absl::MutexLock lock(&mu_);
    last_deadline = deadline;
    last_detail = detail;
    if (!jobs_status.ok()) return jobs_status;
    std::vector<JobSnapshot> out;
    for (const JobSnapshot& j : jobs) {
      if (job_id == nullptr || j.job_id == *job_id) out.push_back(j);
    }
    if (job_id != nullptr && out.empty()) {
      return absl::NotFoundError("no job '" + *job_id + "' (fake)");
    }
    return out;
  }
  absl::Status Ping(absl::Time deadline) override {
    absl::MutexLock lock(&mu_);
    last_ping_deadline = deadline;
    return ping_status;
  }
  size_t NumSessions() const override { return sessions; }
  absl::StatusOr<Timeline> JobTimeline(const std::string& job_id) override {
    return timeline;
  }
  absl::StatusOr<Stalls> JobStalls(const std::string& job_id) override {
    return stalls;
  }

  // Set by the test before calling the handler.
  std::vector<JobSnapshot> jobs;
  absl::Status jobs_status;
  absl::Status ping_status;
  size_t sessions = 0;
  Timeline timeline;
  Stalls stalls;
  // What the handler passed last.
  absl::Time last_deadline;
  absl::Time last_ping_deadline;
  bool last_detail = false;

 private:
  absl::Mutex mu_;
};

}  // namespace gradd

#endif  // GRADD_TESTS_UNIT_ADMIN_FAKE_ADMIN_SOURCE_H_
