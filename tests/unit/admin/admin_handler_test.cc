// AdminHandler over a fake source: what each RPC answers, its errors and
// bounds, and the pure views it is built from (admin/job_view.h).
#include "server/admin/admin_handler.h"

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/src/data/used_map_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/admin/job_manager_source.h"
#include "server/admin/job_view.h"
#include "server/admin/rendezvous_view.h"
#include "server/config.h"
#include "tests/unit/admin/fake_admin_source.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Health = grpc::health::v1::HealthCheckResponse;

ParamInfo Param(std::string name, std::vector<int64_t> shape,
                DType dtype = DType::kFloat32) {
  return ParamInfo{std::move(name), std::move(shape), dtype};
}

// A running two-rank job: used map + three model parameters in two buckets.
JobSnapshot RunningJob(const std::string& id) {
  JobSnapshot j;
  j.job_id = id;
  j.state = JobSnapshot::State::kRunning;
  j.local_world_size = 2;
  j.world_size = 2;
  for (int r = 0; r < 2; ++r) {
    RankSnapshot rank;
    rank.local_rank = r;
    rank.global_rank = r;
    rank.state = RankSnapshot::State::kLive;
    rank.pid = 1000 + r;
    rank.uid = 7;
    j.ranks.push_back(rank);
  }
  j.params = {Param(std::string(kUsedMapParameterName), {3}),
              Param("w", {4, 4}), Param("b", {4}),
              Param("h", {2}, DType::kFloat16)};
  j.planner.first_bucket_cap_bytes = 1 << 20;
  j.planner.bucket_cap_bytes = 25 << 20;
  BucketSnapshot b0;
  b0.dtype = DType::kFloat32;
  b0.size_bytes = 80;
  b0.params = {2, 1};
  b0.done_iteration = 5;
  BucketSnapshot b1;
  b1.dtype = DType::kFloat16;
  b1.size_bytes = 4;
  b1.offset = 256;
  b1.params = {3};
  b1.done_iteration = 5;
  BucketSnapshot b2;
  b2.size_bytes = 12;
  b2.offset = 512;
  b2.params = {0};
  b2.internal = true;
  b2.done_iteration = 5;
  j.buckets = {b0, b1, b2};
  j.num_buckets = 3;
  j.bucket_bytes = 96;
  j.iteration = 5;
  j.stats.buckets = 15;
  j.stats.local_reduce_ns = 1234;
  j.has_used_map = true;
  j.unused_iteration = 5;
  j.unused_params = {2};
  j.ever_unused = true;
  return j;
}

JobSnapshot PendingJob(const std::string& id) {
  JobSnapshot j;
  j.job_id = id;
  j.state = JobSnapshot::State::kPending;
  j.local_world_size = 4;
  RankSnapshot rank;
  rank.local_rank = 1;
  j.ranks.push_back(rank);
  return j;
}

v1::TraceEvent Event(uint64_t it, int bucket, int rank, std::string phase,
                     int64_t start, int64_t dur) {
  v1::TraceEvent e;
  e.set_iteration(it);
  e.set_bucket(bucket);
  e.set_local_rank(rank);
  e.set_phase(std::move(phase));
  e.set_start_unix_ns(start);
  e.set_duration_ns(dur);
  return e;
}

class AdminHandlerTest : public ::testing::Test {
 protected:
  AdminHandlerTest() {
    options_.version = "9.8.7";
    options_.config = DefaultConfig();
    options_.config.set_node_id("node-a");
    options_.config.set_socket_path("/tmp/x/gradd.sock");
    options_.pid = 4242;
    options_.start_time = absl::Now() - absl::Seconds(30);
  }
  AdminHandler& handler() {
    if (!handler_)
      handler_ = std::make_unique<AdminHandler>(&source_, options_);
    return *handler_;
  }
  absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

  FakeAdminSource source_;
  AdminHandlerOptions options_;
  std::unique_ptr<AdminHandler> handler_;
};

TEST_F(AdminHandlerTest, StatusReportsDaemonFactsAndJobCounts) {
  source_.jobs = {RunningJob("a"), PendingJob("b"), RunningJob("c")};
  source_.sessions = 5;
  absl::StatusOr<v1::GetStatusResponse> r =
      handler().GetStatus(v1::GetStatusRequest(), Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version(), "9.8.7");
  EXPECT_EQ(r->node_id(), "node-a");
  EXPECT_EQ(r->socket_path(), "/tmp/x/gradd.sock");
  EXPECT_EQ(r->pid(), 4242);
  EXPECT_EQ(r->running_jobs(), 2u);
  EXPECT_EQ(r->pending_jobs(), 1u);
  EXPECT_EQ(r->sessions(), 5u);
  EXPECT_GE(r->uptime_ns(), absl::ToInt64Nanoseconds(absl::Seconds(30)));
  EXPECT_EQ(r->start_unix_ns(), absl::ToUnixNanos(options_.start_time));
  EXPECT_FALSE(source_.last_detail);
}

// Issue 34: where the rendezvous store is and, on etcd, this daemon's
// lease, asked anew at every call.
TEST_F(AdminHandlerTest, StatusSaysWhereTheRendezvousStoreIs) {
  int calls = 0;
  options_.rendezvous = [&calls] {
    ++calls;
    v1::RendezvousStatus r;
    r.set_backend("etcd");
    r.add_etcd_endpoints("10.0.0.1:2379");
    r.mutable_lease()->set_id(42);
    r.mutable_lease()->set_held(true);
    return r;
  };
  absl::StatusOr<v1::GetStatusResponse> r =
      handler().GetStatus(v1::GetStatusRequest(), Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rendezvous().backend(), "etcd");
  EXPECT_THAT(r->rendezvous().etcd_endpoints(), ElementsAre("10.0.0.1:2379"));
  EXPECT_TRUE(r->rendezvous().lease().held());
  ASSERT_TRUE(handler().GetStatus(v1::GetStatusRequest(), Soon()).ok());
  EXPECT_EQ(calls, 2);
  // Without the callback (tests, older wiring): left empty.
  AdminHandler bare(&source_, AdminHandlerOptions());
  r = bare.GetStatus(v1::GetStatusRequest(), Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_rendezvous());
}

TEST_F(AdminHandlerTest, ListJobsSortsByIdAndSummarises) {
  source_.jobs = {RunningJob("zeta"), PendingJob("alpha")};
  source_.jobs[0].status = absl::AbortedError("rank 1 left");
  source_.jobs[0].state = JobSnapshot::State::kFailed;
  absl::StatusOr<v1::ListJobsResponse> r =
      handler().ListJobs(v1::ListJobsRequest(), Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->jobs_size(), 2);
  const v1::JobSummary& alpha = r->jobs(0);
  EXPECT_EQ(alpha.job_id(), "alpha");
  EXPECT_EQ(alpha.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(alpha.local_world_size(), 4u);
  EXPECT_EQ(alpha.live_local_ranks(), 1u);
  const v1::JobSummary& zeta = r->jobs(1);
  EXPECT_EQ(zeta.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(zeta.iteration(), 5u);
  EXPECT_EQ(zeta.num_buckets(), 3u);
  EXPECT_EQ(zeta.bucket_bytes(), 96u);
  EXPECT_EQ(zeta.live_local_ranks(), 2u);
  EXPECT_THAT(zeta.error(), HasSubstr("rank 1 left"));
}

TEST_F(AdminHandlerTest, GetJobGivesRanksPlanUnusedAndLoggingData) {
  source_.jobs = {RunningJob("j")};
  v1::GetJobRequest req;
  req.set_job_id("j");
  absl::StatusOr<v1::GetJobResponse> r = handler().GetJob(req, Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::JobDetail& d = r->job();
  EXPECT_TRUE(source_.last_detail);
  ASSERT_EQ(d.ranks_size(), 2);
  EXPECT_EQ(d.ranks(1).pid(), 1001);
  EXPECT_EQ(d.ranks(1).state(), v1::RANK_STATE_LIVE);
  ASSERT_EQ(d.nodes_size(), 1);
  EXPECT_EQ(d.nodes(0).node_id(), "node-a");
  ASSERT_EQ(d.plan().buckets_size(), 3);
  EXPECT_EQ(d.plan().buckets(0).dtype(), "float32");
  EXPECT_THAT(d.plan().buckets(0).params(), ElementsAre(2, 1));
  EXPECT_TRUE(d.plan().buckets(2).internal());
  ASSERT_EQ(d.parameters_size(), 4);
  EXPECT_EQ(d.parameters(1).name(), "w");
  EXPECT_EQ(d.parameters(1).bucket(), 0);
  EXPECT_EQ(d.parameters(3).bucket(), 1);
  EXPECT_EQ(d.totals().local_reduce_ns(), 1234u);
  EXPECT_TRUE(d.used_map());
  EXPECT_THAT(d.unused_parameters(), ElementsAre("b"));
  const v1::DdpLoggingData& ddp = d.ddp_logging_data();
  EXPECT_EQ(ddp.world_size(), 2);
  EXPECT_EQ(ddp.bucket_cap_bytes(), 25 << 20);
  EXPECT_EQ(ddp.num_parameter_tensors(), 3);  // the used map is gradd's
  EXPECT_EQ(ddp.total_parameter_size_bytes(), 64 + 16 + 4);
  EXPECT_EQ(ddp.bucket_sizes(), "80, 4");
  EXPECT_EQ(ddp.dtypes(), "float, c10::Half");
  EXPECT_EQ(ddp.unused_parameter_size(), 16);
  EXPECT_EQ(ddp.can_set_static_graph(), 0);
  EXPECT_EQ(ddp.iteration(), 5);
  EXPECT_EQ(ddp.has_rebuilt_buckets(), 0);
  EXPECT_FALSE(ddp.has_rebuilt_bucket_sizes());  // torch: only once rebuilt
  EXPECT_FALSE(ddp.has_rebuilt_per_bucket_param_indices());
  EXPECT_EQ(ddp.num_buckets_reduced(), 15);
}

TEST_F(AdminHandlerTest, GetJobWithoutUsedMapLeavesUnusedFieldsUnset) {
  JobSnapshot j = RunningJob("j");
  j.has_used_map = false;
  j.unused_params.clear();
  source_.jobs = {j};
  v1::GetJobRequest req;
  req.set_job_id("j");
  absl::StatusOr<v1::GetJobResponse> r = handler().GetJob(req, Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->job().ddp_logging_data().has_unused_parameter_size());
  EXPECT_FALSE(r->job().ddp_logging_data().has_can_set_static_graph());
}

TEST_F(AdminHandlerTest, RebuiltJobReportsBothPlans) {
  JobSnapshot j = RunningJob("j");
  j.rebuilt = true;
  j.rebuild_iteration = 1;
  j.rebuild_ready_order = {3, 1, 2, 0};
  j.initial_buckets = j.buckets;
  j.buckets[0].params = {1};
  j.buckets[0].size_bytes = 64;
  j.buckets[1].params = {2, 3};
  source_.jobs = {j};
  v1::GetJobRequest req;
  req.set_job_id("j");
  absl::StatusOr<v1::GetJobResponse> r = handler().GetJob(req, Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->job().rebuilt());
  EXPECT_THAT(r->job().rebuild_ready_order(), ElementsAre(3, 1, 2, 0));
  const v1::DdpLoggingData& ddp = r->job().ddp_logging_data();
  EXPECT_EQ(ddp.has_rebuilt_buckets(), 1);
  EXPECT_EQ(ddp.bucket_sizes(), "80, 4");
  EXPECT_EQ(ddp.rebuilt_bucket_sizes(), "64, 20");
  // torch's model indices: gradd's used map (index 0) left out.
  EXPECT_EQ(ddp.rebuilt_per_bucket_param_indices(), "0, 1 2");
}

TEST_F(AdminHandlerTest, GetJobTakesTimingsReadyOrderAndStallsFromSource) {
  source_.jobs = {RunningJob("j")};
  source_.timeline.events = {
      // iteration 4: bucket 1 ready before bucket 0
      Event(4, 0, 0, "ready", 100, 10), Event(4, 0, 1, "ready", 100, 50),
      Event(4, 1, 0, "ready", 100, 5), Event(4, 1, 1, "ready", 100, 20),
      Event(4, 1, -1, "local_reduce", 130, 7), Event(4, 1, -1, "done", 137, 0),
      Event(4, 0, -1, "local_reduce", 150, 9), Event(4, 0, -1, "done", 159, 0),
      // iteration 5 incomplete (no done for bucket 0): not the ready order
      Event(5, 0, 0, "ready", 300, 1), Event(5, 1, -1, "local_reduce", 300, 3),
      Event(5, 1, -1, "done", 303, 0)};
  source_.timeline.note = "ring wrapped";
  v1::Stall stall;
  stall.set_job_id("j");
  stall.set_bucket(0);
  stall.add_missing_local_ranks(1);
  source_.stalls.stalls = {stall};
  v1::GetJobRequest req;
  req.set_job_id("j");
  absl::StatusOr<v1::GetJobResponse> r = handler().GetJob(req, Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::JobDetail& d = r->job();
  EXPECT_THAT(d.ready_order(), ElementsAre(1, 0));
  ASSERT_EQ(d.bucket_timings_size(), 2);
  const v1::BucketTiming& b1 = d.bucket_timings(1);
  EXPECT_EQ(b1.bucket(), 1);
  ASSERT_GE(b1.phases_size(), 2);
  EXPECT_EQ(b1.phases(0).phase(), "ready");
  EXPECT_EQ(b1.phases(0).count(), 2u);
  EXPECT_EQ(b1.phases(0).total_ns(), 25);
  EXPECT_EQ(b1.phases(0).max_ns(), 20);
  EXPECT_EQ(b1.phases(1).phase(), "local_reduce");
  EXPECT_EQ(b1.phases(1).count(), 2u);
  EXPECT_EQ(b1.phases(1).last_ns(), 3);  // iteration 5's
  ASSERT_EQ(d.stalls_size(), 1);
  EXPECT_THAT(d.stalls(0).missing_local_ranks(), ElementsAre(1));
  EXPECT_THAT(d.note(), HasSubstr("ring wrapped"));
}

TEST_F(AdminHandlerTest, UnknownOrEmptyJobIsAnError) {
  source_.jobs = {RunningJob("j")};
  v1::GetJobRequest req;
  req.set_job_id("nope");
  EXPECT_EQ(handler().GetJob(req, Soon()).status().code(),
            absl::StatusCode::kNotFound);
  req.set_job_id("");
  EXPECT_EQ(handler().GetJob(req, Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::GetTraceRequest trace;
  trace.set_job_id("nope");
  EXPECT_EQ(handler().GetTrace(trace, Soon()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(AdminHandlerTest, HungEngineIsUnavailableNotTheCallersTimeout) {
  source_.jobs_status = absl::DeadlineExceededError("control loop hung");
  absl::StatusOr<v1::ListJobsResponse> r =
      handler().ListJobs(v1::ListJobsRequest(), Soon());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("control loop hung"));
}

TEST_F(AdminHandlerTest, ReadsAreBoundedEvenWithoutACallerDeadline) {
  source_.jobs = {RunningJob("j")};
  const absl::Time before = absl::Now();
  ASSERT_TRUE(
      handler().ListJobs(v1::ListJobsRequest(), absl::InfiniteFuture()).ok());
  EXPECT_LE(source_.last_deadline, absl::Now() + AdminHandler::kMaxWait);
  EXPECT_GE(source_.last_deadline, before);
}

TEST_F(AdminHandlerTest, TraceCarriesEventsNodeAndNote) {
  source_.jobs = {RunningJob("j")};
  source_.timeline.events = {Event(1, 0, -1, "network", 10, 20)};
  source_.timeline.note = "partial";
  v1::GetTraceRequest req;
  req.set_job_id("j");
  absl::StatusOr<v1::GetTraceResponse> r = handler().GetTrace(req, Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->job_id(), "j");
  EXPECT_EQ(r->node_id(), "node-a");
  ASSERT_EQ(r->events_size(), 1);
  EXPECT_EQ(r->events(0).phase(), "network");
  EXPECT_EQ(r->note(), "partial");
}

TEST_F(AdminHandlerTest, ConfigIsTheEffectiveConfig) {
  absl::StatusOr<v1::GetConfigResponse> r =
      handler().GetConfig(v1::GetConfigRequest(), Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->config().node_id(), "node-a");
  EXPECT_EQ(r->config().max_jobs(), options_.config.max_jobs());
  EXPECT_THAT(r->text(), HasSubstr("node-a"));
}

TEST_F(AdminHandlerTest, HealthFollowsTheControlLoop) {
  EXPECT_EQ(*handler().Health("", Soon()), Health::SERVING);
  EXPECT_EQ(*handler().Health("gradd.v1.Admin", Soon()), Health::SERVING);
  source_.ping_status = absl::DeadlineExceededError("hung");
  EXPECT_EQ(*handler().Health("", Soon()), Health::NOT_SERVING);
  EXPECT_EQ(handler().Health("no.such.Service", Soon()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(AdminHandlerTest, HealthProbeEndsBeforeTheCallersDeadline) {
  const absl::Time deadline = absl::Now() + absl::Milliseconds(800);
  ASSERT_TRUE(handler().Health("", deadline).ok());
  EXPECT_LT(source_.last_ping_deadline, deadline);
  ASSERT_TRUE(handler().Health("", absl::Now() + absl::Hours(1)).ok());
  EXPECT_LE(source_.last_ping_deadline,
            absl::Now() + AdminHandler::kHealthProbe);
}

TEST(AdminConversionTest, EngineEventsAndStallsBecomeProtos) {
  const v1::TraceEvent e =
      ToTraceEvent(TimelineEvent{7, 2, -1, "network", 1000, 250});
  EXPECT_EQ(e.iteration(), 7u);
  EXPECT_EQ(e.bucket(), 2);
  EXPECT_EQ(e.local_rank(), -1);
  EXPECT_EQ(e.phase(), "network");
  EXPECT_EQ(e.start_unix_ns(), 1000);
  EXPECT_EQ(e.duration_ns(), 250);
  const v1::Stall s = ToStall(StallReport{
      "j", 3, 1, 12.5, {0, 2}, {"node-b"}, {"fc.weight"}, "bucket 1 waits"});
  EXPECT_EQ(s.job_id(), "j");
  EXPECT_EQ(s.iteration(), 3u);
  EXPECT_EQ(s.waited_seconds(), 12.5);
  EXPECT_THAT(s.missing_local_ranks(), ElementsAre(0, 2));
  EXPECT_THAT(s.missing_nodes(), ElementsAre("node-b"));
  EXPECT_THAT(s.unready_parameters(), ElementsAre("fc.weight"));
  EXPECT_EQ(s.message(), "bucket 1 waits");
}

TEST(AdminConversionTest, RankRestartInTheViews) {
  // Restart events (bucket -1) are in the trace but no bucket's timing.
  std::vector<v1::TraceEvent> events = {
      ToTraceEvent(TimelineEvent{1, 0, 0, "ready", 1000, 10}),
      ToTraceEvent(TimelineEvent{1, 0, -1, "done", 1010, 0}),
      ToTraceEvent(TimelineEvent{0, -1, 1, "restarting", 1020, 0}),
      ToTraceEvent(TimelineEvent{2, -1, -1, "iteration_aborted", 1030, 0})};
  std::vector<v1::BucketTiming> timings = BucketTimingsOf(events);
  ASSERT_EQ(timings.size(), 1u);
  EXPECT_EQ(timings[0].bucket(), 0);
  EXPECT_THAT(ReadyOrderOf(events), ElementsAre(0));

  // A restarting rank, with the grace left, and the job's figures.
  JobSnapshot job;
  job.job_id = "r";
  job.state = JobSnapshot::State::kRunning;
  job.rank_restart_grace_ms = 30000;
  job.restarts = 2;
  job.iterations_aborted = 1;
  RankSnapshot live;
  live.local_rank = 0;
  live.state = RankSnapshot::State::kLive;
  RankSnapshot away;
  away.local_rank = 1;
  away.state = RankSnapshot::State::kRestarting;
  away.restart_deadline_unix_ns = absl::GetCurrentTimeNanos() + 20'000'000'000;
  job.ranks = {live, away};
  const v1::JobDetail d = JobDetailOf(job, "node");
  EXPECT_EQ(d.summary().rank_restart_grace_ms(), 30000u);
  EXPECT_EQ(d.summary().restarting_local_ranks(), 1u);
  EXPECT_EQ(d.summary().live_local_ranks(), 1u);
  EXPECT_EQ(d.summary().restarts(), 2u);
  EXPECT_EQ(d.summary().iterations_aborted(), 1u);
  ASSERT_EQ(d.ranks_size(), 2);
  EXPECT_EQ(d.ranks(1).state(), v1::RANK_STATE_RESTARTING);
  EXPECT_GT(d.ranks(1).restart_ms_left(), 15000);
  EXPECT_LE(d.ranks(1).restart_ms_left(), 20000);
  EXPECT_EQ(d.ranks(0).restart_ms_left(), 0);
}

TEST(AdminConversionTest, RendezvousStatusOfTheBuiltInStore) {
  RendezvousFacts facts;
  facts.backend = "builtin";
  facts.port = 29600;
  v1::RendezvousStatus r = RendezvousStatusOf(facts, absl::Now());
  EXPECT_EQ(r.backend(), "builtin");
  EXPECT_EQ(r.coordinator_address(), "");
  EXPECT_EQ(r.port(), 29600u);
  EXPECT_FALSE(r.has_lease());
  EXPECT_EQ(r.etcd_endpoints_size(), 0);
  facts.coordinator_address = "10.0.0.1:29600";
  facts.serving_address = "10.0.0.1:29600";
  r = RendezvousStatusOf(facts, absl::Now());
  EXPECT_EQ(r.coordinator_address(), "10.0.0.1:29600");
  EXPECT_EQ(r.serving_address(), "10.0.0.1:29600");
}

TEST(AdminConversionTest, RendezvousStatusOfEtcdAndItsLease) {
  const absl::Time now = absl::FromUnixSeconds(1700000100);
  RendezvousFacts facts;
  facts.backend = "etcd";
  facts.etcd_endpoints = {"10.0.0.1:2379", "10.0.0.2:2379"};
  facts.etcd_security = "mTLS + user gradd";
  facts.etcd_prefix = "/gradd/";
  EtcdLeaseInfo lease;
  lease.id = 0x694d7b5e2f3a1c04;
  lease.held = false;
  lease.ttl = absl::Seconds(30);
  lease.granted = absl::FromUnixSeconds(1700000000);
  lease.last_kept_alive = absl::FromUnixSeconds(1700000060);
  lease.grants = 2;
  lease.losses = 1;
  lease.failed_keepalives = 4;
  lease.last_error = "UNAVAILABLE: etcd 10.0.0.1:2379,10.0.0.2:2379: ...";
  facts.lease = lease;
  const v1::RendezvousStatus r = RendezvousStatusOf(facts, now);
  EXPECT_EQ(r.backend(), "etcd");
  EXPECT_THAT(r.etcd_endpoints(),
              ElementsAre("10.0.0.1:2379", "10.0.0.2:2379"));
  EXPECT_EQ(r.etcd_security(), "mTLS + user gradd");
  EXPECT_EQ(r.etcd_prefix(), "/gradd/");
  ASSERT_TRUE(r.has_lease());
  const v1::EtcdLeaseStatus& l = r.lease();
  EXPECT_EQ(l.id(), 0x694d7b5e2f3a1c04);
  EXPECT_FALSE(l.held());
  EXPECT_EQ(l.ttl_ms(), 30000);
  EXPECT_EQ(l.granted_unix_ns(), int64_t{1700000000} * 1000000000);
  EXPECT_EQ(l.last_kept_alive_unix_ns(), int64_t{1700000060} * 1000000000);
  EXPECT_EQ(l.last_kept_alive_age_ns(), int64_t{40} * 1000000000);
  EXPECT_EQ(l.grants(), 2u);
  EXPECT_EQ(l.losses(), 1u);
  EXPECT_EQ(l.failed_keepalives(), 4u);
  EXPECT_THAT(l.last_error(), HasSubstr("UNAVAILABLE"));
}

TEST(AdminConversionTest, ServerKnowsTheClientsUsedMapName) {
  EXPECT_EQ(kUsedMapParameterName, std::string_view(kUsedMapParamName));
}

}  // namespace
}  // namespace gradd
