// Pure functions turning engine snapshots (engine/job/job_snapshot.h) and
// timeline events into the admin protos (gradd/v1/admin.proto). No state,
// no threads.
#ifndef GRADD_SERVER_ADMIN_JOB_VIEW_H_
#define GRADD_SERVER_ADMIN_JOB_VIEW_H_

#include <string>
#include <vector>

#include "gradd/v1/admin.pb.h"
#include "server/engine/job/job_snapshot.h"

namespace gradd {

v1::JobSummary JobSummaryOf(const JobSnapshot& job);

// Everything but timings, ready order and stalls (see below). `node_id` is
// this daemon's, for a single-node job's node list.
v1::JobDetail JobDetailOf(const JobSnapshot& job, const std::string& node_id);

// torch's DDP logging-data fields the daemon knows (admin.proto).
v1::DdpLoggingData DdpLoggingDataOf(const JobSnapshot& job);

// Per bucket and phase: count, total, last (latest iteration) and longest
// duration over `events`. Buckets in index order, phases in the order the
// pipeline runs them (ready, local_reduce, network, write_back, done, then
// any other by name).
std::vector<v1::BucketTiming> BucketTimingsOf(
    const std::vector<v1::TraceEvent>& events);

// The buckets in the order they became ready in the latest iteration for
// which every bucket seen in `events` has a "done" event: by the end of the
// bucket's last "ready" event (its last rank), else by the start of its
// first node phase. Empty when no iteration is complete.
std::vector<int32_t> ReadyOrderOf(const std::vector<v1::TraceEvent>& events);

}  // namespace gradd

#endif  // GRADD_SERVER_ADMIN_JOB_VIEW_H_
