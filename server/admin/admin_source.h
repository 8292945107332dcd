// Where the admin handler (admin/admin_handler.h) reads the daemon's state:
// snapshots of the jobs, a liveness ping of the engine's control loop, the
// session count, and each job's timeline and stall reports. The daemon's
// implementation is JobManagerAdminSource (admin/job_manager_source.h);
// tests pass FakeAdminSource (tests/unit/admin/fake_admin_source.h).
//
// Implementations are thread-safe and never block past the deadline they
// are given.
#ifndef GRADD_SERVER_ADMIN_ADMIN_SOURCE_H_
#define GRADD_SERVER_ADMIN_ADMIN_SOURCE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradd/v1/admin.pb.h"
#include "server/engine/job/job_snapshot.h"

namespace gradd {

class AdminSourceInterface {
 public:
  // A job's timeline events or stall reports, and why they are empty or
  // partial when that is known (e.g. the ring wrapped, nothing recorded).
  struct Timeline {
    std::vector<v1::TraceEvent> events;
    std::string note;
  };
  struct Stalls {
    std::vector<v1::Stall> stalls;
    std::string note;
  };

  virtual ~AdminSourceInterface() = default;

  // JobManager::Snapshot's contract (every job, or only `*job_id`'s:
  // NOT_FOUND; DEADLINE_EXCEEDED when the control loop does not answer by
  // `deadline`; UNAVAILABLE when stopping), with every attached rank's pid
  // and uid filled in.
  virtual absl::StatusOr<std::vector<JobSnapshot>> Jobs(
      absl::Time deadline, bool detail, const std::string* job_id) = 0;
  // OK when the engine's control loop answered by `deadline`.
  virtual absl::Status Ping(absl::Time deadline) = 0;
  // Open trainer sessions.
  virtual size_t NumSessions() const = 0;
  // The job's recorded timeline / current stalls. NOT_FOUND for an unknown
  // job (callers check existence through Jobs first, so a source may also
  // answer an empty list).
  virtual absl::StatusOr<Timeline> JobTimeline(const std::string& job_id) = 0;
  virtual absl::StatusOr<Stalls> JobStalls(const std::string& job_id) = 0;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ADMIN_ADMIN_SOURCE_H_
