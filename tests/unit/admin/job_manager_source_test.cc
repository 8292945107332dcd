// The admin view of a real JobManager (fake sessions, no gRPC): snapshots
// of pending and running jobs, the used map the engine records, and health
// while the control loop is wedged.
#include "server/admin/job_manager_source.h"

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/admin/admin_handler.h"
#include "tests/unit/engine/manager/job_manager_fixture.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Health = grpc::health::v1::HealthCheckResponse;

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

class JobManagerSourceTest : public JobManagerFixture {
 protected:
  JobManagerAdminSource& source() {
    if (!source_)
      source_ = std::make_unique<JobManagerAdminSource>(&manager(), nullptr);
    return *source_;
  }
  std::unique_ptr<JobManagerAdminSource> source_;
};

TEST_F(JobManagerSourceTest, PendingJobShowsItsAttachingRanks) {
  const uint64_t session = sessions_.Open();
  auto pending =
      StartAttach(manager(), MakeRequest("half", 1, 2, session, {{"w", {8}}}));
  absl::StatusOr<std::vector<JobSnapshot>> jobs =
      source().Jobs(Soon(), /*detail=*/true, nullptr);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  const JobSnapshot& j = (*jobs)[0];
  EXPECT_EQ(j.job_id, "half");
  EXPECT_EQ(j.state, JobSnapshot::State::kPending);
  EXPECT_EQ(j.local_world_size, 2);
  ASSERT_EQ(j.ranks.size(), 1u);
  EXPECT_EQ(j.ranks[0].local_rank, 1);
  EXPECT_EQ(j.ranks[0].state, RankSnapshot::State::kAttaching);
  ASSERT_EQ(j.params.size(), 1u);
  EXPECT_EQ(j.params[0].name, "w");
  sessions_.Close(session);
  EXPECT_EQ(pending->Get().status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(JobManagerSourceTest, RunningJobReportsIterationPlanAndUnusedParams) {
  // The client's used map first (3 model parameters), then the model.
  std::vector<TestParam> params = {{std::string(kUsedMapParameterName), {3}},
                                   {"a", {4}},
                                   {"b", {4}},
                                   {"c", {4}}};
  std::vector<std::unique_ptr<TestRank>> ranks = AttachJob("run", 2, params);
  ASSERT_EQ(ranks.size(), 2u);
  // Iteration 1: rank 0 used a, rank 1 used a and c; nobody used b.
  const float used[2][3] = {{1, 0, 0}, {1, 0, 1}};
  for (auto& rank : ranks) {
    const v1::AttachResponse& resp = rank->response();
    for (int b = 0; b < resp.buckets_size(); ++b) {
      const v1::BucketSpec& spec = resp.buckets(b);
      for (int i = 0; i < spec.param_indices_size(); ++i) {
        if (spec.param_indices(i) != 0) continue;
        std::memcpy(rank->bucket(b) + spec.param_offsets(i), used[rank->rank()],
                    sizeof(used[0]));
      }
    }
    for (int b = 0; b < resp.buckets_size(); ++b) rank->Publish(b, 1);
  }
  for (auto& rank : ranks) ASSERT_TRUE(rank->WaitAllDone(1));

  absl::StatusOr<std::vector<JobSnapshot>> jobs =
      source().Jobs(Soon(), /*detail=*/true, nullptr);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  const JobSnapshot& j = (*jobs)[0];
  EXPECT_EQ(j.state, JobSnapshot::State::kRunning);
  EXPECT_EQ(j.iteration, 1u);
  EXPECT_EQ(j.world_size, 2);
  EXPECT_EQ(j.num_buckets,
            static_cast<size_t>(ranks[0]->response().buckets_size()));
  ASSERT_EQ(j.buckets.size(), j.num_buckets);
  for (const BucketSnapshot& b : j.buckets) EXPECT_EQ(b.done_iteration, 1u);
  ASSERT_EQ(j.ranks.size(), 2u);
  EXPECT_EQ(j.ranks[1].state, RankSnapshot::State::kLive);
  EXPECT_EQ(j.ranks[1].session_id, ranks[1]->session());
  EXPECT_TRUE(j.has_used_map);
  EXPECT_EQ(j.unused_iteration, 1u);
  EXPECT_THAT(j.unused_params, ElementsAre(2));  // "b"
  EXPECT_TRUE(j.ever_unused);
  EXPECT_EQ(j.stats.buckets, j.num_buckets);

  // Through the handler: names, and a rank gone shows as detached.
  ASSERT_TRUE(Detach(manager(), "run", 1, ranks[1]->session()).ok());
  AdminHandlerOptions options;
  options.config = config_;
  AdminHandler handler(&source(), options);
  v1::GetJobRequest req;
  req.set_job_id("run");
  absl::StatusOr<v1::GetJobResponse> r = handler.GetJob(req, Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->job().unused_parameters(), ElementsAre("b"));
  EXPECT_EQ(r->job().ranks(1).state(), v1::RANK_STATE_DETACHED);
  EXPECT_EQ(r->job().summary().live_local_ranks(), 1u);
  req.set_job_id("other");
  EXPECT_EQ(handler.GetJob(req, Soon()).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(Detach(manager(), "run", 0, ranks[0]->session()).ok());
}

TEST_F(JobManagerSourceTest, RebuiltJobShowsItsReadyOrderAndBothPlans) {
  // Four 64-byte parameters, caps of 128 bytes: two per bucket.
  const double cap = 128.0 / (1 << 20);
  std::vector<std::unique_ptr<TestRank>> ranks = AttachJob(
      "rb", 2, {{"p0", {16}}, {"p1", {16}}, {"p2", {16}}, {"p3", {16}}}, cap,
      cap);
  ASSERT_EQ(ranks.size(), 2u);
  for (auto& rank : ranks) {
    for (int b = 0; b < rank->response().buckets_size(); ++b) {
      rank->Publish(b, 1);
    }
  }
  for (auto& rank : ranks) ASSERT_TRUE(rank->WaitAllDone(1));
  std::vector<absl::Notification> answered(2);
  std::vector<absl::Status> results(2);
  for (int r = 0; r < 2; ++r) {
    v1::RebuildBucketsRequest req;
    req.set_job_id("rb");
    req.set_local_rank(r);
    req.set_session_id(ranks[r]->session());
    req.set_iteration(1);
    for (int32_t p : {0, 2, 1, 3}) req.add_ready_order(p);
    manager().HandleRebuildBuckets(
        req, Soon(),
        [&answered, &results,
         r](absl::StatusOr<v1::RebuildBucketsResponse> resp) {
          results[r] = resp.status();
          answered[r].Notify();
        });
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(answered[r].WaitForNotificationWithTimeout(absl::Seconds(20)));
    ASSERT_TRUE(results[r].ok()) << results[r];
  }
  const std::string id = "rb";
  absl::StatusOr<std::vector<JobSnapshot>> jobs =
      source().Jobs(Soon(), /*detail=*/true, &id);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  const JobSnapshot& j = (*jobs)[0];
  EXPECT_TRUE(j.rebuilt);
  EXPECT_EQ(j.rebuild_iteration, 1u);
  EXPECT_THAT(j.rebuild_ready_order, ElementsAre(0, 2, 1, 3));
  ASSERT_EQ(j.buckets.size(), 2u);
  EXPECT_THAT(j.buckets[0].params, ElementsAre(0, 2));
  EXPECT_THAT(j.buckets[1].params, ElementsAre(1, 3));
  ASSERT_EQ(j.initial_buckets.size(), 2u);
  EXPECT_THAT(j.initial_buckets[0].params, ElementsAre(3, 2));
  EXPECT_EQ(j.iteration, 1u);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(Detach(manager(), "rb", r, ranks[r]->session()).ok());
  }
}

// A registry whose Claim (called on the job manager's control thread
// during an Attach) blocks until released: a wedged control loop.
class WedgingRegistry final : public SessionRegistryInterface {
 public:
  explicit WedgingRegistry(FakeSessionRegistry* inner) : inner_(inner) {}
  bool IsLive(uint64_t id) const override { return inner_->IsLive(id); }
  bool Claim(uint64_t id) override {
    entered.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(60));
    return inner_->Claim(id);
  }
  absl::Status SendFds(uint64_t id, uint64_t attach_id,
                       const std::vector<int>& fds) override {
    return inner_->SendFds(id, attach_id, fds);
  }
  absl::Notification entered;
  absl::Notification release;

 private:
  FakeSessionRegistry* const inner_;
};

TEST_F(JobManagerSourceTest, HealthIsNotServingWhileTheControlLoopIsWedged) {
  WedgingRegistry wedging(&sessions_);
  JobManager manager(config_, &wedging, &pool_);
  JobManagerAdminSource source(&manager, nullptr);
  AdminHandlerOptions options;
  options.config = config_;
  AdminHandler handler(&source, options);
  ASSERT_EQ(*handler.Health("", Soon()), Health::SERVING);

  const uint64_t session = sessions_.Open();
  auto pending =
      StartAttach(manager, MakeRequest("wedge", 0, 1, session, {{"w", {4}}}));
  ASSERT_TRUE(
      wedging.entered.WaitForNotificationWithTimeout(absl::Seconds(20)));

  const absl::Time deadline = absl::Now() + absl::Milliseconds(400);
  EXPECT_EQ(*handler.Health("", deadline), Health::NOT_SERVING);
  EXPECT_LT(absl::Now(), deadline);  // answered before the prober gave up
  absl::StatusOr<v1::ListJobsResponse> jobs = handler.ListJobs(
      v1::ListJobsRequest(), absl::Now() + absl::Milliseconds(200));
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(jobs.status().message(), HasSubstr("control loop"));

  wedging.release.Notify();
  EXPECT_EQ(*handler.Health("", Soon()), Health::SERVING);
  ASSERT_TRUE(pending->Get().ok());
  manager.Stop();
  // Stopped: refused at once, not after the deadline.
  EXPECT_EQ(source.Ping(Soon()).code(), absl::StatusCode::kUnavailable);
}

TEST_F(JobManagerSourceTest, HealthIsNotServingOnceShutdownBegins) {
  AdminHandlerOptions options;
  options.config = config_;
  AdminHandler handler(&source(), options);
  ASSERT_EQ(*handler.Health("", Soon()), Health::SERVING);
  manager().Shutdown();
  EXPECT_EQ(source().Ping(Soon()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(*handler.Health("", Soon()), Health::NOT_SERVING);
  // Reads still answer while the daemon drains.
  EXPECT_TRUE(source().Jobs(Soon(), /*detail=*/false, nullptr).ok());
}

TEST_F(JobManagerSourceTest, StoppingManagerReleasesAWaitingAdminCall) {
  WedgingRegistry wedging(&sessions_);
  JobManager manager(config_, &wedging, &pool_);
  JobManagerAdminSource source(&manager, nullptr);
  const uint64_t session = sessions_.Open();
  auto pending =
      StartAttach(manager, MakeRequest("wedge", 0, 1, session, {{"w", {4}}}));
  ASSERT_TRUE(
      wedging.entered.WaitForNotificationWithTimeout(absl::Seconds(20)));

  // A ping stuck behind the wedged control thread ...
  absl::Notification pinged;
  absl::Status ping;
  std::thread asker([&] {
    ping = source.Ping(absl::Now() + absl::Seconds(60));
    pinged.Notify();
  });
  // ... is answered once the manager stops, not at its deadline (Stop
  // itself waits for the wedged thread, so it runs on a thread of its own).
  std::thread stopper([&] { manager.Stop(); });
  EXPECT_TRUE(pinged.WaitForNotificationWithTimeout(absl::Seconds(20)));
  wedging.release.Notify();
  stopper.join();
  asker.join();
  EXPECT_EQ(ping.code(), absl::StatusCode::kUnavailable) << ping;
  // The attach the wedge held was answered one way or the other by then.
  EXPECT_TRUE(pending->done.HasBeenNotified());
}

}  // namespace
}  // namespace gradd
