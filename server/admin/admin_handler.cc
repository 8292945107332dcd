#include "server/admin/admin_handler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/admin/job_view.h"
#include "server/config.h"

namespace gradd {
namespace {

using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

// The services a health check may name ("" = the whole daemon).
constexpr const char* kServices[] = {"", "gradd.v1.Node", "gradd.v1.Admin",
                                     "grpc.health.v1.Health"};

absl::Time Bound(absl::Time deadline, absl::Duration limit) {
  return std::min(deadline, absl::Now() + limit);
}

// A hung control loop is the daemon's condition, not the caller's timeout.
absl::Status Explain(const absl::Status& s) {
  if (s.code() != absl::StatusCode::kDeadlineExceeded) return s;
  return absl::UnavailableError(s.message());
}

}  // namespace

absl::StatusOr<v1::GetStatusResponse> AdminHandler::GetStatus(
    const v1::GetStatusRequest& request, absl::Time deadline) {
  absl::StatusOr<std::vector<JobSnapshot>> jobs =
      source_->Jobs(Bound(deadline, kMaxWait), /*detail=*/false, nullptr);
  if (!jobs.ok()) return Explain(jobs.status());
  v1::GetStatusResponse r;
  r.set_version(options_.version);
  r.set_node_id(options_.config.node_id());
  r.set_socket_path(options_.config.socket_path());
  r.set_pid(options_.pid);
  r.set_start_unix_ns(absl::ToUnixNanos(options_.start_time));
  r.set_uptime_ns(absl::ToInt64Nanoseconds(absl::Now() - options_.start_time));
  for (const JobSnapshot& job : *jobs) {
    if (job.state == JobSnapshot::State::kPending ||
        job.state == JobSnapshot::State::kForming) {
      r.set_pending_jobs(r.pending_jobs() + 1);
    } else {
      r.set_running_jobs(r.running_jobs() + 1);
    }
  }
  r.set_sessions(static_cast<uint32_t>(source_->NumSessions()));
  if (options_.network_security) {
    r.set_network_security(options_.network_security());
  }
  if (options_.rendezvous) *r.mutable_rendezvous() = options_.rendezvous();
  return r;
}

absl::StatusOr<v1::ListJobsResponse> AdminHandler::ListJobs(
    const v1::ListJobsRequest& request, absl::Time deadline) {
  absl::StatusOr<std::vector<JobSnapshot>> jobs =
      source_->Jobs(Bound(deadline, kMaxWait), /*detail=*/false, nullptr);
  if (!jobs.ok()) return Explain(jobs.status());
  std::sort(jobs->begin(), jobs->end(),
            [](const JobSnapshot& a, const JobSnapshot& b) {
              return a.job_id < b.job_id;
            });
  v1::ListJobsResponse r;
  for (const JobSnapshot& job : *jobs) *r.add_jobs() = JobSummaryOf(job);
  return r;
}

absl::StatusOr<JobSnapshot> AdminHandler::OneJob(const std::string& job_id,
                                                 bool detail,
                                                 absl::Time deadline) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  absl::StatusOr<std::vector<JobSnapshot>> jobs =
      source_->Jobs(Bound(deadline, kMaxWait), detail, &job_id);
  if (!jobs.ok()) return Explain(jobs.status());
  if (jobs->size() != 1) {
    return absl::NotFoundError(
        absl::StrCat("no job '", job_id, "' on this daemon"));
  }
  return std::move(jobs->front());
}

absl::StatusOr<v1::GetJobResponse> AdminHandler::GetJob(
    const v1::GetJobRequest& request, absl::Time deadline) {
  ASSIGN_OR_RETURN(JobSnapshot job,
                   OneJob(request.job_id(), /*detail=*/true, deadline));
  v1::GetJobResponse r;
  v1::JobDetail* d = r.mutable_job();
  *d = JobDetailOf(job, options_.config.node_id());
  std::vector<std::string> notes;
  if (absl::StatusOr<AdminSourceInterface::Timeline> t =
          source_->JobTimeline(job.job_id);
      t.ok()) {
    for (v1::BucketTiming& timing : BucketTimingsOf(t->events)) {
      *d->add_bucket_timings() = std::move(timing);
    }
    for (int32_t b : ReadyOrderOf(t->events)) d->add_ready_order(b);
    if (!t->note.empty()) notes.push_back(t->note);
  } else {
    notes.push_back(absl::StrCat("timeline: ", t.status().ToString()));
  }
  if (absl::StatusOr<AdminSourceInterface::Stalls> s =
          source_->JobStalls(job.job_id);
      s.ok()) {
    for (v1::Stall& stall : s->stalls) *d->add_stalls() = std::move(stall);
    if (!s->note.empty()) notes.push_back(s->note);
  } else {
    notes.push_back(absl::StrCat("stalls: ", s.status().ToString()));
  }
  d->set_note(absl::StrJoin(notes, "; "));
  return r;
}

absl::StatusOr<v1::GetConfigResponse> AdminHandler::GetConfig(
    const v1::GetConfigRequest& request, absl::Time deadline) {
  v1::GetConfigResponse r;
  *r.mutable_config() = options_.config;
  r.set_text(ConfigToText(options_.config));
  return r;
}

absl::StatusOr<v1::GetTraceResponse> AdminHandler::GetTrace(
    const v1::GetTraceRequest& request, absl::Time deadline) {
  ASSIGN_OR_RETURN(JobSnapshot job,
                   OneJob(request.job_id(), /*detail=*/false, deadline));
  ASSIGN_OR_RETURN(AdminSourceInterface::Timeline t,
                   source_->JobTimeline(job.job_id));
  v1::GetTraceResponse r;
  r.set_job_id(job.job_id);
  r.set_node_id(job.node_ids.empty() ? options_.config.node_id()
                                     : job.node_ids[job.node_rank]);
  r.set_node_rank(job.node_rank);
  for (v1::TraceEvent& e : t.events) *r.add_events() = std::move(e);
  r.set_note(t.note);
  return r;
}

absl::StatusOr<ServingStatus> AdminHandler::Health(const std::string& service,
                                                   absl::Time deadline) {
  if (std::find(std::begin(kServices), std::end(kServices), service) ==
      std::end(kServices)) {
    return absl::NotFoundError(
        absl::StrCat("gradd serves no service '", service,
                     "' (known: \"\", gradd.v1.Node, gradd.v1.Admin, "
                     "grpc.health.v1.Health)"));
  }
  // Answer a little before the caller's deadline, so a hung control loop
  // reads as NOT_SERVING rather than as the probe's own timeout.
  const absl::Duration left = deadline - absl::Now();
  const absl::Duration probe =
      std::min(kHealthProbe,
               left == absl::InfiniteDuration() ? kHealthProbe : left * 3 / 4);
  absl::Status alive = source_->Ping(absl::Now() + probe);
  return alive.ok() ? grpc::health::v1::HealthCheckResponse::SERVING
                    : grpc::health::v1::HealthCheckResponse::NOT_SERVING;
}

}  // namespace gradd
