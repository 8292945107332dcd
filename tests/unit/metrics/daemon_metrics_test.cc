#include "server/metrics/daemon_metrics.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rendezvous/etcd/etcd_lease.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

JobInfo Info(const std::string& id, uint64_t bytes = 4096) {
  JobInfo info;
  info.job_id = id;
  info.local_world_size = 2;
  info.shared_memory_bytes = bytes;
  return info;
}

TEST(DaemonMetricsTest, AttachesDetachesAndJobsAreCounted) {
  DaemonMetrics metrics;
  metrics.OnAttach(absl::StatusCode::kOk);
  metrics.OnAttach(absl::StatusCode::kOk);
  metrics.OnAttach(absl::StatusCode::kInvalidArgument);
  std::unique_ptr<JobEventSinkInterface> job =
      metrics.OnJobStarted(Info("train-1", 1 << 20));
  std::string text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("gradd_attaches_total{code=\"OK\"} 2"));
  EXPECT_THAT(text,
              HasSubstr("gradd_attaches_total{code=\"INVALID_ARGUMENT\"} 1"));
  EXPECT_THAT(text, HasSubstr("gradd_ranks_attached 2"));
  EXPECT_THAT(text, HasSubstr("gradd_jobs 1"));
  EXPECT_THAT(text, HasSubstr("gradd_shared_memory_bytes 1048576"));

  metrics.OnDetach(/*clean=*/true);
  metrics.OnDetach(/*clean=*/false);
  job.reset();
  text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("gradd_detaches_total{reason=\"detach\"} 1"));
  EXPECT_THAT(text, HasSubstr("gradd_detaches_total{reason=\"disconnect\"} 1"));
  EXPECT_THAT(text, HasSubstr("gradd_ranks_attached 0"));
  EXPECT_THAT(text, HasSubstr("gradd_jobs 0"));
  EXPECT_THAT(text, HasSubstr("gradd_shared_memory_bytes 0"));
}

TEST(DaemonMetricsTest, BucketsPhasesAndIterationsPerJob) {
  DaemonMetrics metrics;
  std::unique_ptr<JobEventSinkInterface> job =
      metrics.OnJobStarted(Info("train-1"));
  BucketEvent e;
  e.bytes = 1000;
  e.first_ready_ns = 1;
  e.start_ns = 2000001;                   // 2 ms waiting for the last rank
  e.phases.local_reduce = {10, 3000000};  // 3 ms
  e.phases.network = {20, 500000};        // 0.5 ms
  job->OnBucket(e);
  job->OnBucket(e);
  IterationEvent it;
  it.step_ns = 250000000;
  it.communication_ns = 4000000;
  it.overlapped_ns = 1000000;
  job->OnIteration(it);
  job->OnFailed(absl::StatusCode::kAborted, "x");
  job->OnStall(StallReport());
  const std::string text = metrics.Serialize();
  EXPECT_THAT(text,
              HasSubstr("gradd_buckets_reduced_total{job_id=\"train-1\"} 2"));
  EXPECT_THAT(text,
              HasSubstr("gradd_reduced_bytes_total{job_id=\"train-1\"} 2000"));
  EXPECT_THAT(text, HasSubstr("gradd_iterations_total{job_id=\"train-1\"} 1"));
  EXPECT_THAT(text, HasSubstr("gradd_backward_overlap_ratio{job_id=\"train-1\"}"
                              " 0.25"));
  EXPECT_THAT(text, HasSubstr("gradd_communication_seconds_total{job_id="
                              "\"train-1\"} 0.004"));
  EXPECT_THAT(text, HasSubstr("gradd_phase_seconds_count{phase="
                              "\"local_reduce\"} 2"));
  EXPECT_THAT(text, HasSubstr("gradd_phase_seconds_bucket{phase="
                              "\"local_reduce\",le=\"0.0025\"} 0"));
  EXPECT_THAT(text, HasSubstr("gradd_phase_seconds_bucket{phase="
                              "\"local_reduce\",le=\"0.005\"} 2"));
  EXPECT_THAT(text,
              HasSubstr("gradd_phase_seconds_count{phase=\"network\"} 2"));
  // A phase that did not run is not observed.
  EXPECT_THAT(text,
              HasSubstr("gradd_phase_seconds_count{phase=\"write_back\"} 0"));
  EXPECT_THAT(text, HasSubstr("gradd_handover_wait_seconds_count 2"));
  EXPECT_THAT(text, HasSubstr("gradd_iteration_seconds_count 1"));
  EXPECT_THAT(text, HasSubstr("gradd_job_failures_total{code=\"ABORTED\"} 1"));
  EXPECT_THAT(text, HasSubstr("gradd_stalls_total 1"));
}

TEST(DaemonMetricsTest, CountsPrioritySchedulingFromTheBucketEvents) {
  DaemonMetrics metrics;
  std::unique_ptr<JobEventSinkInterface> job =
      metrics.OnJobStarted(Info("train-2"));
  BucketEvent e;
  e.bytes = 100;
  e.phases.negotiations = 2;
  e.phases.out_of_order = true;
  job->OnBucket(e);
  e.phases.negotiations = 1;
  e.phases.out_of_order = false;
  job->OnBucket(e);
  const std::string text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("gradd_schedule_negotiations_total 3"));
  EXPECT_THAT(text, HasSubstr("gradd_buckets_out_of_order_total 1"));
}

TEST(DaemonMetricsTest, JobSeriesGoAwayWithTheJobAndAreCapped) {
  DaemonMetrics metrics;
  {
    std::unique_ptr<JobEventSinkInterface> job =
        metrics.OnJobStarted(Info("short-lived"));
    EXPECT_THAT(metrics.Serialize(), HasSubstr("job_id=\"short-lived\""));
  }
  EXPECT_THAT(metrics.Serialize(), Not(HasSubstr("short-lived")));

  std::vector<std::unique_ptr<JobEventSinkInterface>> jobs;
  for (int i = 0; i <= DaemonMetrics::kMaxJobSeries; ++i) {
    jobs.push_back(metrics.OnJobStarted(Info("j" + std::to_string(i))));
  }
  std::string text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("job_id=\"j255\""));
  EXPECT_THAT(text, Not(HasSubstr("job_id=\"j256\"")));
  EXPECT_THAT(text, HasSubstr("gradd_jobs 257"));
  BucketEvent e;
  e.bytes = 1;
  jobs.back()->OnBucket(e);  // no series of its own: no crash, not counted
  jobs.clear();
  text = metrics.Serialize();
  EXPECT_THAT(text, Not(HasSubstr("job_id=")));
  EXPECT_THAT(text, HasSubstr("gradd_jobs 0"));
}

TEST(DaemonMetricsTest, ReformationsFollowTheLiveWorldSize) {
  DaemonMetrics metrics;
  JobInfo info = Info("elastic-1");
  info.num_nodes = 3;
  info.world_size = 6;
  std::unique_ptr<JobEventSinkInterface> job = metrics.OnJobStarted(info);
  std::string text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("gradd_job_world_size{job_id=\"elastic-1\"} 6"));
  // Every reason is exported from the start, at 0.
  EXPECT_THAT(
      text, HasSubstr("gradd_job_reformations_total{reason=\"node_lost\"} 0"));
  EXPECT_THAT(text, HasSubstr("gradd_nodes_lost_total 0"));

  NetworkReformEvent broke;
  broke.epoch = 0;
  broke.reason = "node 'c' (node rank 2) is gone: connection reset";
  job->OnNetworkBroken(broke);
  // A break alone changes nothing: the job may still fail.
  EXPECT_THAT(metrics.Serialize(),
              HasSubstr("gradd_job_world_size{job_id=\"elastic-1\"} 6"));

  NetworkReformEvent lost = broke;
  lost.epoch = 1;
  lost.lost = {"c"};
  lost.num_nodes = 2;
  lost.world_size = 4;
  lost.aborted_iteration = 17;
  job->OnNetworkReformed(lost);
  text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("gradd_job_world_size{job_id=\"elastic-1\"} 4"));
  EXPECT_THAT(
      text, HasSubstr("gradd_job_reformations_total{reason=\"node_lost\"} 1"));
  EXPECT_THAT(text, HasSubstr("gradd_nodes_lost_total 1"));
  EXPECT_THAT(text, HasSubstr("gradd_iterations_aborted_total 1"));

  NetworkReformEvent back;
  back.epoch = 2;
  back.reason = "node 'c' asks to be admitted";
  back.admitted = {"c"};
  back.num_nodes = 3;
  back.world_size = 6;
  job->OnNetworkReformed(back);
  NetworkReformEvent rejoined;
  rejoined.epoch = 3;
  rejoined.reason = "local rank 1 rejoined";
  rejoined.num_nodes = 3;
  rejoined.world_size = 6;
  job->OnNetworkReformed(rejoined);
  text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("gradd_job_world_size{job_id=\"elastic-1\"} 6"));
  EXPECT_THAT(
      text,
      HasSubstr("gradd_job_reformations_total{reason=\"node_admitted\"} 1"));
  EXPECT_THAT(
      text,
      HasSubstr("gradd_job_reformations_total{reason=\"rank_rejoined\"} 1"));
  EXPECT_THAT(text, HasSubstr("gradd_nodes_lost_total 1"));
  // Re-formation without an aborted iteration: not counted as one.
  EXPECT_THAT(text, HasSubstr("gradd_iterations_aborted_total 1"));
}

TEST(DaemonMetricsTest, ReformReasonLabelIsAFixedSet) {
  NetworkReformEvent e;
  e.reason = "anything at all";
  EXPECT_EQ(ReformReasonLabel(e), "other");
  e.reason = "local rank 0 restarted";
  EXPECT_EQ(ReformReasonLabel(e), "rank_restarted");
  e.reason = "local rank 0 rejoined";  // an older daemon's closer's text
  EXPECT_EQ(ReformReasonLabel(e), "rank_restarted");
  e.admitted = {"d"};
  EXPECT_EQ(ReformReasonLabel(e), "node_admitted");
  e.lost = {"b"};  // lost wins: the job shrank
  EXPECT_EQ(ReformReasonLabel(e), "node_lost");
  // The closer's decision, when it made one, is the label.
  e.cause = ReformCause::kRankRestarted;
  EXPECT_EQ(ReformReasonLabel(e), "rank_restarted");
  e.cause = ReformCause::kOther;
  EXPECT_EQ(ReformReasonLabel(e), "other");
}

TEST(DaemonMetricsTest, OldLabelValuesKeepTheDeprecatedRankRejoined) {
  NetworkReformEvent e;
  e.cause = ReformCause::kRankRestarted;
  EXPECT_EQ(ReformReasonLabel(e, /*new_label_values=*/false), "rank_rejoined");
  e.cause = ReformCause::kNodeLost;
  EXPECT_EQ(ReformReasonLabel(e, false), "node_lost");
  EXPECT_THAT(DeprecatedLabelWarning(), HasSubstr("metrics.new_label_values"));
}

// The daemon's exposition: this release's default keeps the old value (and
// pre-creates its series); new_label_values switches both.
TEST(DaemonMetricsTest, ReformationReasonSeriesFollowNewLabelValues) {
  for (bool new_values : {false, true}) {
    DaemonMetrics metrics(new_values);
    JobInfo info = Info("j");
    info.num_nodes = 2;
    std::unique_ptr<JobEventSinkInterface> sink = metrics.OnJobStarted(info);
    NetworkReformEvent e;
    e.cause = ReformCause::kRankRestarted;
    e.epoch = 1;
    sink->OnNetworkReformed(e);
    const std::string text = metrics.Serialize();
    const std::string counted = new_values ? "rank_restarted" : "rank_rejoined";
    const std::string absent = new_values ? "rank_rejoined" : "rank_restarted";
    EXPECT_THAT(text, HasSubstr("gradd_job_reformations_total{reason=\"" +
                                counted + "\"} 1"))
        << new_values;
    EXPECT_THAT(text, Not(HasSubstr("reason=\"" + absent + "\"")))
        << new_values;
  }
}

// Issue 32: the closer's cause is the label, whatever this node saw; a
// rank's return in a multi-node job is one aborted iteration, not two; the
// nodes' gauges follow the verdict's live and lost lists.
TEST(DaemonMetricsTest, TheClosersCauseCountsOnceAndNodesFollowTheVerdict) {
  DaemonMetrics metrics;
  JobInfo info = Info("elastic-2");
  info.num_nodes = 3;
  info.world_size = 3;
  info.node_ids = {"a", "b", "c"};
  std::unique_ptr<JobEventSinkInterface> job = metrics.OnJobStarted(info);
  std::string text = metrics.Serialize();
  for (const char* id : {"a", "b", "c"}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat(
                          "gradd_job_node_up{job_id=\"elastic-2\",node_id=\"",
                          id, "\"} 1")));
  }

  // What node a saw was a connection reset; the closer says a rank of b
  // restarted. On b, the rank's own event comes with the re-formation.
  NetworkReformEvent e;
  e.epoch = 1;
  e.reason = "local rank 1 of node 'b' restarted";
  e.cause = ReformCause::kRankRestarted;
  e.node_ids = {"a", "b", "c"};
  e.num_nodes = 3;
  e.world_size = 3;
  e.aborted_iteration = 9;
  job->OnNetworkReformed(e);
  RankRestartEvent r;
  r.local_rank = 1;
  r.aborted_iteration = 9;
  r.with_reformation = true;
  job->OnRankRestarted(r);
  text = metrics.Serialize();
  EXPECT_THAT(
      text,
      HasSubstr("gradd_job_reformations_total{reason=\"rank_rejoined\"} 1"));
  EXPECT_THAT(text,
              HasSubstr("gradd_job_reformations_total{reason=\"other\"} 0"));
  EXPECT_THAT(text, HasSubstr("gradd_iterations_aborted_total 1"));
  EXPECT_THAT(text, HasSubstr("gradd_rank_restarts_total 1"));

  // c lost, then back.
  e.epoch = 2;
  e.cause = ReformCause::kNodeLost;
  e.reason = "node 'c' lost";
  e.lost = {"c"};
  e.node_ids = {"a", "b"};
  e.lost_node_ids = {"c"};
  job->OnNetworkReformed(e);
  text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("gradd_job_node_up{job_id=\"elastic-2\","
                              "node_id=\"c\"} 0"));
  EXPECT_THAT(text, HasSubstr("gradd_job_node_up{job_id=\"elastic-2\","
                              "node_id=\"a\"} 1"));
  e.epoch = 3;
  e.cause = ReformCause::kNodeAdmitted;
  e.reason = "node 'c' admitted";
  e.lost = {};
  e.admitted = {"c"};
  e.node_ids = {"a", "b", "c"};
  e.lost_node_ids = {};
  job->OnNetworkReformed(e);
  text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("gradd_job_node_up{job_id=\"elastic-2\","
                              "node_id=\"c\"} 1"));
  EXPECT_THAT(text, HasSubstr("gradd_iterations_aborted_total 3"));
  // A single-node rank restart counts its own abort.
  RankRestartEvent alone;
  alone.aborted_iteration = 12;
  job->OnRankRestarted(alone);
  EXPECT_THAT(metrics.Serialize(),
              HasSubstr("gradd_iterations_aborted_total 4"));
  // The job's node series go with it.
  job.reset();
  EXPECT_THAT(metrics.Serialize(), Not(HasSubstr("gradd_job_node_up{")));
}

TEST(DaemonMetricsTest, RendezvousRequestsByMethod) {
  DaemonMetrics metrics;
  metrics.OnRendezvousRequest("Get");
  metrics.OnRendezvousRequest("Get");
  metrics.OnRendezvousRequest("Set");
  const std::string text = metrics.Serialize();
  EXPECT_THAT(text,
              HasSubstr("gradd_rendezvous_requests_total{method=\"Get\"} 2"));
  EXPECT_THAT(text,
              HasSubstr("gradd_rendezvous_requests_total{method=\"Set\"} 1"));
}

// Issue 34: each job's network epoch, from its start (an admitted node
// starts at the running job's) through its re-formations.
TEST(DaemonMetricsTest, JobEpochFollowsTheReformations) {
  DaemonMetrics metrics;
  JobInfo info = Info("elastic");
  info.epoch = 3;
  std::unique_ptr<JobEventSinkInterface> job = metrics.OnJobStarted(info);
  EXPECT_THAT(metrics.Serialize(),
              HasSubstr("gradd_job_epoch{job_id=\"elastic\"} 3"));
  NetworkReformEvent e;
  e.epoch = 4;
  e.cause = ReformCause::kNodeLost;
  e.world_size = 2;
  job->OnNetworkReformed(e);
  EXPECT_THAT(metrics.Serialize(),
              HasSubstr("gradd_job_epoch{job_id=\"elastic\"} 4"));
  std::unique_ptr<JobEventSinkInterface> fresh =
      metrics.OnJobStarted(Info("fresh"));
  EXPECT_THAT(metrics.Serialize(),
              HasSubstr("gradd_job_epoch{job_id=\"fresh\"} 0"));
  job.reset();
  EXPECT_THAT(metrics.Serialize(), Not(HasSubstr("job_id=\"elastic\"")));
}

// Issue 36 point 4: the cap of the job's plan, and its autotune's state
// and trials.
TEST(DaemonMetricsTest, BucketCapFollowsAutotune) {
  DaemonMetrics metrics;
  JobInfo fixed = Info("fixed");
  fixed.bucket_cap_bytes = 25 << 20;
  std::unique_ptr<JobEventSinkInterface> a = metrics.OnJobStarted(fixed);
  JobInfo tuned = Info("tuned");
  tuned.bucket_cap_bytes = 25 << 20;
  tuned.autotune = true;
  std::unique_ptr<JobEventSinkInterface> b = metrics.OnJobStarted(tuned);
  std::string text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("gradd_job_bucket_cap_bytes{job_id=\"fixed\"} "
                              "26214400"));
  EXPECT_THAT(text, HasSubstr("gradd_job_autotune_state{job_id=\"fixed\"} 0"));
  EXPECT_THAT(text, HasSubstr("gradd_job_autotune_state{job_id=\"tuned\"} 1"));
  AutotuneEvent e;
  e.iteration = 1;
  e.bucket_cap_bytes = 1 << 20;
  e.trial = 1;
  e.trials = 2;
  b->OnAutotune(e);
  e.iteration = 5;
  e.bucket_cap_bytes = 4 << 20;
  e.trial = 2;
  b->OnAutotune(e);
  text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("gradd_job_bucket_cap_bytes{job_id=\"tuned\"} "
                              "4194304"));
  EXPECT_THAT(text,
              HasSubstr("gradd_job_autotune_trials_total{job_id=\"tuned\"} "
                        "2"));
  e.iteration = 9;
  e.bucket_cap_bytes = 1 << 20;
  e.trial = 0;
  e.settled = true;
  b->OnAutotune(e);
  text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("gradd_job_bucket_cap_bytes{job_id=\"tuned\"} "
                              "1048576"));
  EXPECT_THAT(text, HasSubstr("gradd_job_autotune_state{job_id=\"tuned\"} 2"));
  EXPECT_THAT(text,
              HasSubstr("gradd_job_autotune_trials_total{job_id=\"tuned\"} "
                        "2"));
  b.reset();
  EXPECT_THAT(metrics.Serialize(), Not(HasSubstr("job_id=\"tuned\"")));
}

TEST(DaemonMetricsTest, RendezvousBackendInfoSaysWhereTheStoreIs) {
  DaemonMetrics builtin;
  DaemonMetrics::RendezvousBackend where;
  where.backend = "builtin";
  builtin.SetRendezvousBackend(where);
  EXPECT_THAT(builtin.Serialize(),
              HasSubstr("gradd_rendezvous_backend_info{backend=\"builtin\"} "
                        "1"));
  // No etcd series on the built-in store, not even their names.
  EXPECT_THAT(builtin.Serialize(), Not(HasSubstr("gradd_etcd_")));

  DaemonMetrics etcd;
  etcd.SetRendezvousBackend({.backend = "etcd",
                             .address = "10.0.0.1:2379,10.0.0.2:2379",
                             .security = "mTLS + user gradd",
                             .prefix = "/gradd/"});
  EXPECT_THAT(etcd.Serialize(),
              HasSubstr("gradd_rendezvous_backend_info{address=\"10.0.0.1:"
                        "2379,10.0.0.2:2379\",backend=\"etcd\",prefix=\"/"
                        "gradd/\",security=\"mTLS + user gradd\"} 1"));
}

TEST(DaemonMetricsTest, EtcdCallsAndEndpointFailuresAreCounted) {
  DaemonMetrics metrics;
  const char* const methods[] = {"Range", "Txn", "LeaseKeepAlive"};
  metrics.EnableEtcd({"10.0.0.1:2379", "10.0.0.2:2379"}, methods);
  std::string text = metrics.Serialize();
  // Exported at 0 from the start, so rate() sees the first call.
  EXPECT_THAT(text, HasSubstr("gradd_etcd_requests_total{code=\"OK\","
                              "method=\"Txn\"} 0"));
  EXPECT_THAT(text, HasSubstr("gradd_etcd_endpoint_failures_total{endpoint="
                              "\"10.0.0.2:2379\"} 0"));
  EXPECT_THAT(text, HasSubstr("gradd_etcd_lease_held 0"));
  EXPECT_THAT(text, HasSubstr("gradd_etcd_lease_grants_total 0"));

  metrics.OnEtcdCall("Txn", absl::StatusCode::kOk);
  metrics.OnEtcdCall("Txn", absl::StatusCode::kOk);
  metrics.OnEtcdCall("LeaseKeepAlive", absl::StatusCode::kUnavailable);
  metrics.OnEtcdEndpointFailure("10.0.0.1:2379");
  text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("gradd_etcd_requests_total{code=\"OK\","
                              "method=\"Txn\"} 2"));
  EXPECT_THAT(text, HasSubstr("gradd_etcd_requests_total{code=\"UNAVAILABLE\","
                              "method=\"LeaseKeepAlive\"} 1"));
  EXPECT_THAT(text, HasSubstr("gradd_etcd_endpoint_failures_total{endpoint="
                              "\"10.0.0.1:2379\"} 1"));
}

TEST(DaemonMetricsTest, EtcdLeaseFollowsItsEvents) {
  DaemonMetrics metrics;
  metrics.EnableEtcd({"127.0.0.1:2379"}, {});
  EtcdLeaseInfo lease;
  lease.id = 0x694d7b5e2f3a1c04;
  lease.held = true;
  lease.ttl = absl::Seconds(30);
  lease.granted = absl::FromUnixSeconds(1700000000);
  lease.last_kept_alive = lease.granted;
  lease.grants = 1;
  metrics.OnEtcdLease(EtcdLeaseEvent::kGranted, lease);
  std::string text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("gradd_etcd_lease_held 1"));
  EXPECT_THAT(text, HasSubstr("gradd_etcd_lease_ttl_seconds 30"));
  EXPECT_THAT(text, HasSubstr("gradd_etcd_lease_info{lease_id="
                              "\"694d7b5e2f3a1c04\"} 1"));
  EXPECT_THAT(text, HasSubstr("gradd_etcd_lease_grants_total 1"));
  EXPECT_THAT(text, HasSubstr("gradd_etcd_lease_last_keepalive_timestamp_"
                              "seconds 1700000000"));

  // Unanswered keep-alives: held until a TTL has passed, then not.
  lease.failed_keepalives = 1;
  metrics.OnEtcdLease(EtcdLeaseEvent::kKeepAliveFailed, lease);
  EXPECT_THAT(metrics.Serialize(), HasSubstr("gradd_etcd_lease_held 1"));
  lease.held = false;
  metrics.OnEtcdLease(EtcdLeaseEvent::kKeepAliveFailed, lease);
  EXPECT_THAT(metrics.Serialize(), HasSubstr("gradd_etcd_lease_held 0"));
  // etcd says it expired; a new one replaces it at the next write.
  metrics.OnEtcdLease(EtcdLeaseEvent::kLost, lease);
  EXPECT_THAT(metrics.Serialize(),
              HasSubstr("gradd_etcd_lease_losses_total 1"));
  lease.id = 0x694d7b5e2f3a1d99;
  lease.held = true;
  lease.grants = 2;
  lease.last_kept_alive = absl::FromUnixSeconds(1700000100);
  metrics.OnEtcdLease(EtcdLeaseEvent::kGranted, lease);
  text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("gradd_etcd_lease_held 1"));
  EXPECT_THAT(text, HasSubstr("gradd_etcd_lease_grants_total 2"));
  EXPECT_THAT(text, HasSubstr("lease_id=\"694d7b5e2f3a1d99\"} 1"));
  EXPECT_THAT(text, Not(HasSubstr("694d7b5e2f3a1c04")));
  // Revoked as the daemon stops: no lease id series.
  lease.id = 0;
  lease.held = false;
  metrics.OnEtcdLease(EtcdLeaseEvent::kRevoked, lease);
  text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("gradd_etcd_lease_held 0"));
  EXPECT_THAT(text, Not(HasSubstr("gradd_etcd_lease_info{")));
}

// Rank restarts (the engine's restart events, engine/observe/job_events.h)
// counted, and the job's world size following them; the restarts
// themselves are tests/unit/engine/manager/rank_restart_test.cc.
TEST(DaemonMetricsTest, RankRestartsAbortsAndWorldSizeAreExported) {
  DaemonMetrics metrics;
  JobInfo info = Info("r");
  info.world_size = 2;
  std::unique_ptr<JobEventSinkInterface> sink = metrics.OnJobStarted(info);
  EXPECT_THAT(metrics.Serialize(),
              HasSubstr("gradd_job_world_size{job_id=\"r\"} 2"));
  RankRestartEvent e;
  e.local_rank = 1;
  e.world_size = 1;
  sink->OnRankRestarting(e);
  EXPECT_THAT(metrics.Serialize(),
              HasSubstr("gradd_job_world_size{job_id=\"r\"} 1"));
  e.world_size = 2;
  e.aborted_iteration = 7;
  sink->OnRankRestarted(e);
  e.aborted_iteration = 0;
  sink->OnRankRestarted(e);
  const std::string text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("gradd_rank_restarts_total 2"));
  EXPECT_THAT(text, HasSubstr("gradd_iterations_aborted_total 1"));
  EXPECT_THAT(text, HasSubstr("gradd_job_world_size{job_id=\"r\"} 2"));
  sink.reset();
  EXPECT_THAT(metrics.Serialize(),
              Not(HasSubstr("gradd_job_world_size{job_id=\"r\"}")));
}

}  // namespace
}  // namespace gradd
