// Job's one phase (job.h "Phase") seen from its events: every change comes
// through EnterPhase as one OnPhase event, in order, and a job fails once.
// Node rank 0 of a two-node job elastic across nodes, a fake reducer whose
// completions the test gives, the test acting as the trainers on the real
// control block and as the JobManager (reform handler, Reformed).
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/bucket_planner.h"
#include "common/control_block.h"
#include "common/control_mapping.h"
#include "common/doorbell.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/job/job.h"
#include "server/engine/reduce/fake_bucket_reducer.h"
#include "tests/unit/engine/job/job_control_test.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

constexpr auto kWait = absl::Seconds(10);

class PhaseSink final : public JobEventSinkInterface {
 public:
  void OnPhase(const JobPhaseEvent& e) override {
    absl::MutexLock lock(&mu_);
    events_.push_back(e);
  }
  // Waits (bounded) for at least n phase events.
  std::vector<JobPhaseEvent> Wait(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return events_.size() >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
    return events_;
  }
  std::vector<std::string> Path() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> path;
    for (const JobPhaseEvent& e : events_) path.push_back(e.from + ">" + e.to);
    return path;
  }

 private:
  absl::Mutex mu_;
  std::vector<JobPhaseEvent> events_ ABSL_GUARDED_BY(mu_);
};

class JobPhaseTest : public JobControlTest {
 protected:
  void MakeJob(int num_nodes, int min_nodes) {
    JobSpec spec = TwoBucketSpec("phase-unit");
    spec.num_nodes = num_nodes;
    spec.world_size = 2 * num_nodes;
    if (num_nodes > 1) spec.node_ids = {"a", "b"};
    spec.min_nodes = min_nodes;
    plan_ = spec.plan;
    net_ = std::make_shared<FakeReductions>();
    auto job =
        Job::Create(std::move(spec), std::make_unique<FakeBucketReducer>(
                                         net_, /*multi_node=*/num_nodes > 1));
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *std::move(job);
    auto sink = std::make_unique<PhaseSink>();
    sink_ = sink.get();
    job_->AddEventSink(std::move(sink));
    job_->SetReformationHandler([this](Job::ReformationRequest) {
      absl::MutexLock lock(&mu_);
      ++breaks_;
    });
    MapControl(*job_);
    job_->Start();
  }
  void TearDown() override {
    if (job_) job_->Stop();
  }
  bool WaitBreaks(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return breaks_ >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
  }
  static void Settle() {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
  }

  BucketPlan plan_;
  std::shared_ptr<FakeReductions> net_;
  PhaseSink* sink_ = nullptr;
  std::unique_ptr<Job> job_;
  absl::Mutex mu_;
  int breaks_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_F(JobPhaseTest, ReFormationGoesThroughDrainingAndReforming) {
  MakeJob(/*num_nodes=*/2, /*min_nodes=*/1);
  job_->RequestReformation("node 'c' asks to be admitted");
  ASSERT_TRUE(WaitBreaks(1));
  std::vector<JobPhaseEvent> e = sink_->Wait(2);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].from, "running");
  EXPECT_EQ(e[0].to, "draining");
  EXPECT_EQ(e[0].why, "node 'c' asks to be admitted");
  EXPECT_EQ(e[0].epoch, 0u);
  EXPECT_EQ(e[1].from, "draining");
  EXPECT_EQ(e[1].to, "reforming");
  EXPECT_GE(e[1].at_ns, e[0].at_ns);
  // The admin snapshot shows the phase the events said.
  EXPECT_EQ(job_->Snapshot(/*detail=*/false).phase, JobPhase::kReforming);

  auto net2 = std::make_shared<FakeReductions>();
  Job::ReformationResult r;
  r.reducer = std::make_unique<FakeBucketReducer>(net2, /*multi_node=*/true);
  r.epoch = 1;
  r.num_nodes = 1;
  r.world_size = 2;
  r.node_ids = {"a"};
  r.sync_seq = 3;
  r.lost = {"b"};
  job_->Reformed(std::move(r));
  e = sink_->Wait(3);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[2].from, "reforming");
  EXPECT_EQ(e[2].to, "running");
  EXPECT_EQ(e[2].epoch, 1u);
  EXPECT_TRUE(job_->status().ok());
  EXPECT_EQ(job_->Snapshot(false).phase, JobPhase::kRunning);
}

TEST_F(JobPhaseTest, FailedReFormationEndsInFailedOnce) {
  MakeJob(2, 2);
  job_->RequestReformation("node 'b' (node rank 1) is gone");
  ASSERT_TRUE(WaitBreaks(1));
  job_->Reformed(absl::UnavailableError("1 node left, min_nodes = 2"));
  const std::vector<JobPhaseEvent> e = sink_->Wait(3);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[2].from, "reforming");
  EXPECT_EQ(e[2].to, "failed");
  EXPECT_THAT(e[2].why, HasSubstr("min_nodes = 2"));
  EXPECT_EQ(job_->status().code(), absl::StatusCode::kAborted);
  // Failed is final: a later break or failure moves nothing.
  job_->RequestReformation("again");
  job_->Fail(absl::StatusCode::kCancelled, "daemon shutdown");
  Settle();
  EXPECT_EQ(sink_->Path(),
            (std::vector<std::string>{"running>draining", "draining>reforming",
                                      "reforming>failed"}));
}

TEST_F(JobPhaseTest, EngineFailureIsOneEventToFailed) {
  MakeJob(/*num_nodes=*/1, /*min_nodes=*/0);
  // Local rank 0 publishes iteration 3 while 1 is next: a protocol error
  // the engine fails the job for.
  Publish(0, 0, 3);
  const std::vector<JobPhaseEvent> e = sink_->Wait(1);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].from, "running");
  EXPECT_EQ(e[0].to, "failed");
  EXPECT_THAT(e[0].why, HasSubstr("published bucket 0 for iteration 3"));
  EXPECT_EQ(job_->status().code(), absl::StatusCode::kFailedPrecondition);
  Settle();
  EXPECT_EQ(sink_->Path().size(), 1u);
}

TEST_F(JobPhaseTest, FailureFromOutsideIsSeenByTheEngine) {
  MakeJob(1, 0);
  job_->Fail(absl::StatusCode::kCancelled, "daemon shutting down");
  const std::vector<JobPhaseEvent> e = sink_->Wait(1);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].to, "failed");
  EXPECT_THAT(e[0].why, HasSubstr("daemon shutting down"));
  EXPECT_EQ(job_->Snapshot(false).phase, JobPhase::kFailed);
  EXPECT_EQ(JobPhaseName(job_->Snapshot(false).phase), "failed");
}

TEST_F(JobPhaseTest, PlanSwitchGoesThroughSwitchingPlan) {
  MakeJob(1, 0);
  absl::Mutex mu;
  std::optional<absl::Status> answer;
  job_->ExpectRebuild(0);
  job_->SwitchPlan(0, plan_, [&](absl::Status s) {
    absl::MutexLock lock(&mu);
    answer = s;
  });
  {
    absl::MutexLock lock(&mu);
    auto has = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return answer.has_value();
    };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&has), kWait));
    EXPECT_TRUE(answer->ok()) << *answer;
  }
  const std::vector<JobPhaseEvent> e = sink_->Wait(2);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].to, "switching_plan");
  EXPECT_EQ(e[0].why, "bucket rebuild after iteration 0");
  EXPECT_EQ(e[1].from, "switching_plan");
  EXPECT_EQ(e[1].to, "running");
}

}  // namespace
}  // namespace gradd
