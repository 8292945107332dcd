// Elastic multi-node jobs (job.h "Elastic multi-node jobs", job_reformation.cc;
// common/control_block.h "Re-formation") driven by hand: node rank 0 of a
// two-node job, a fake reducer whose completions the test gives (success
// or a network error), the test acting as the trainers on the real control
// block and as the JobManager (the reform handler, Reformed).
#include <chrono>
#include <functional>
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
#include "common/shm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/job/job.h"
#include "server/engine/reduce/fake_bucket_reducer.h"
#include "tests/unit/engine/job/job_control_test.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr auto kWait = absl::Seconds(10);

class RecordingSink final : public JobEventSinkInterface {
 public:
  void OnNetworkBroken(const NetworkReformEvent& e) override {
    absl::MutexLock lock(&mu_);
    broken_.push_back(e);
  }
  void OnNetworkReformed(const NetworkReformEvent& e) override {
    absl::MutexLock lock(&mu_);
    reformed_.push_back(e);
  }
  std::vector<NetworkReformEvent> broken() {
    absl::MutexLock lock(&mu_);
    return broken_;
  }
  // Waits (bounded) for the reformed event: it follows the sync_seq the
  // test waits on.
  std::vector<NetworkReformEvent> reformed() {
    absl::MutexLock lock(&mu_);
    auto any = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !reformed_.empty();
    };
    mu_.AwaitWithTimeout(absl::Condition(&any), kWait);
    return reformed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<NetworkReformEvent> broken_ ABSL_GUARDED_BY(mu_);
  std::vector<NetworkReformEvent> reformed_ ABSL_GUARDED_BY(mu_);
};

struct RejoinResult {
  absl::Mutex mu;
  std::optional<absl::StatusOr<v1::AttachResponse>> response
      ABSL_GUARDED_BY(mu);
  bool answered() {
    absl::MutexLock lock(&mu);
    return response.has_value();
  }
  bool Wait() {
    absl::MutexLock lock(&mu);
    auto has = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return response.has_value();
    };
    return mu.AwaitWithTimeout(absl::Condition(&has), kWait);
  }
};

struct JobOptions {
  int min_nodes = 1;
  std::chrono::milliseconds grace{0};
  bool divide_by_initial = false;
  bool handler = true;
  // A node admitted into its running job: the initial world size it
  // learned (0: it formed with the job).
  int initial_world_size = 0;
};

class JobReformationTest : public JobControlTest {
 protected:
  // Node rank 0 of 2 (nodes 'a', 'b'), two local ranks, world size 4; two
  // float32 parameters of 64 bytes, one bucket each.
  void MakeJob(const JobOptions& o) {
    JobSpec spec = TwoBucketSpec("elastic-unit");
    spec.num_nodes = 2;
    spec.node_rank = 0;
    spec.world_size = 4;
    spec.node_ids = {"a", "b"};
    spec.min_nodes = o.min_nodes;
    spec.rank_restart_grace = o.grace;
    spec.divide_by_initial_world_size = o.divide_by_initial;
    spec.initial_world_size = o.initial_world_size;
    ASSERT_EQ(spec.plan.buckets.size(), 2u);
    net_ = std::make_shared<FakeReductions>();
    auto job = Job::Create(std::move(spec), std::make_unique<FakeBucketReducer>(
                                                net_, /*multi_node=*/true));
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *std::move(job);
    auto sink = std::make_unique<RecordingSink>();
    sink_ = sink.get();
    job_->AddEventSink(std::move(sink));
    if (o.handler) {
      job_->SetReformationHandler([this](Job::ReformationRequest b) {
        absl::MutexLock lock(&breaks_mu_);
        breaks_.push_back(std::move(b));
      });
    }
    MapControl(*job_);
    job_->Start();
  }
  void TearDown() override {
    if (job_) job_->Stop();
  }

  uint64_t Row(int rank, int bucket) {
    return layout_->ready_row(control_.data(), rank)[bucket].load();
  }
  bool WaitFor(const std::function<bool()>& ready) {
    return WaitForDaemon(header_, me_, ready, std::chrono::microseconds(20),
                         std::chrono::seconds(10));
  }
  bool WaitError() {
    return WaitFor(
        [&] { return header_->status.load(std::memory_order_acquire) != 0; });
  }
  size_t breaks() {
    absl::MutexLock lock(&breaks_mu_);
    return breaks_.size();
  }
  bool WaitBreaks(size_t n) {
    absl::MutexLock lock(&breaks_mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(breaks_mu_) {
      return breaks_.size() >= n;
    };
    return breaks_mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
  }
  Job::ReformationRequest break_at(size_t k) {
    absl::MutexLock lock(&breaks_mu_);
    return breaks_.at(k);
  }
  // Both ranks hand iteration `it` over; the reducer's hand-overs from
  // *next on complete with OK.
  void RunIteration(FakeReductions& net, uint64_t it, size_t* next) {
    for (int b = 0; b < 2; ++b) {
      Publish(0, b, it);
      Publish(1, b, it);
    }
    ASSERT_TRUE(net.WaitStarted(*next + 2));
    for (int k = 0; k < 2; ++k) net.Finish((*next)++, absl::OkStatus());
    ASSERT_TRUE(WaitFor([&] { return Done(0) >= it && Done(1) >= it; }));
  }
  // A re-formation result over a fresh fake reducer (*net).
  Job::ReformationResult Result(std::shared_ptr<FakeReductions>* net) {
    *net = std::make_shared<FakeReductions>();
    Job::ReformationResult r;
    r.reducer = std::make_unique<FakeBucketReducer>(*net, /*multi_node=*/true);
    r.epoch = 1;
    r.node_rank = 0;
    r.num_nodes = 1;
    r.world_size = 2;
    r.node_ids = {"a"};
    r.sync_seq = 7;
    r.lost = {"b"};
    return r;
  }
  // Some time for the engine to (not) act.
  static void Settle() {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
  }

  std::shared_ptr<FakeReductions> net_;
  RecordingSink* sink_ = nullptr;
  std::unique_ptr<Job> job_;
  absl::Mutex breaks_mu_;
  std::vector<Job::ReformationRequest> breaks_ ABSL_GUARDED_BY(breaks_mu_);
};

TEST_F(JobReformationTest, FreshJobPublishesTheWorldAndAttachFields) {
  MakeJob({.min_nodes = 1});
  EXPECT_EQ(header_->world_size.load(), 4u);
  EXPECT_EQ(header_->epoch.load(), 0u);
  EXPECT_EQ(header_->state_behind.load(), 0u);
  const v1::AttachResponse resp = job_->ResponseFor(1);
  EXPECT_EQ(resp.min_nodes(), 1u);
  EXPECT_EQ(resp.epoch(), 0u);
  EXPECT_EQ(resp.world_size(), 4);
  EXPECT_EQ(resp.num_nodes(), 2);
  EXPECT_EQ(resp.global_rank(), 1);
  const JobSnapshot s = job_->Snapshot(false);
  EXPECT_EQ(s.epoch, 0u);
  EXPECT_EQ(s.min_nodes, 1);
  EXPECT_EQ(s.world_size, 4);
  EXPECT_THAT(s.node_ids, ElementsAre("a", "b"));
}

// (a) Not elastic (no min_nodes, no grace): a network error ends the job as
// before, and RequestReformation does nothing.
TEST_F(JobReformationTest, NotElasticNetworkErrorFailsTheJob) {
  MakeJob({.min_nodes = 0});
  job_->RequestReformation("ignored");
  size_t next = 0;
  RunIteration(*net_, 1, &next);
  EXPECT_TRUE(job_->status().ok());
  for (int b = 0; b < 2; ++b) {
    Publish(0, b, 2);
    Publish(1, b, 2);
  }
  ASSERT_TRUE(net_->WaitStarted(4));
  net_->Finish(2, absl::UnavailableError("node 'b' (node rank 1) is gone"));
  ASSERT_TRUE(WaitError());
  EXPECT_EQ(job_->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(job_->status().message(),
              HasSubstr("node 'b' (node rank 1) is gone"));
  net_->Finish(3, absl::UnavailableError("echo"));
  Settle();
  EXPECT_EQ(breaks(), 0u);
  EXPECT_TRUE(sink_->broken().empty());
  EXPECT_FALSE(net_->is_destroyed());
}

// (b) Elastic: an error mid-iteration drains, then breaks once; Reformed
// aborts the iteration in progress and the job goes on on the new reducer.
TEST_F(JobReformationTest, ErrorMidIterationDrainsReformsAndAbortsIt) {
  MakeJob({.min_nodes = 1});
  size_t next = 0;
  RunIteration(*net_, 1, &next);
  // Iteration 2: both buckets with the reducer; bucket 1 fails first,
  // bucket 0 is still in flight.
  for (int b = 0; b < 2; ++b) {
    Publish(0, b, 2);
    Publish(1, b, 2);
  }
  ASSERT_TRUE(net_->WaitStarted(4));
  ASSERT_EQ(net_->at(3), std::make_pair(1, uint64_t{2}));
  net_->Finish(3, absl::UnavailableError("node 'b' (node rank 1) is gone"));
  Settle();
  EXPECT_EQ(breaks(), 0u) << "bucket 0 is still with the reducer";
  EXPECT_TRUE(job_->status().ok());
  net_->Finish(2, absl::OkStatus());
  ASSERT_TRUE(WaitBreaks(1));
  Settle();
  EXPECT_EQ(breaks(), 1u);
  const Job::ReformationRequest b = break_at(0);
  EXPECT_THAT(b.reason, HasSubstr("node 'b' (node rank 1) is gone"));
  EXPECT_EQ(b.completed_iteration, 1u);  // bucket 1 never finished 2
  EXPECT_EQ(b.sync_seq, 0u);
  EXPECT_EQ(b.epoch, 0u);
  EXPECT_TRUE(net_->is_destroyed()) << "the old group is closed at the break";
  EXPECT_TRUE(job_->status().ok());
  EXPECT_EQ(Done(0), 2u);
  EXPECT_EQ(Done(1), 1u);
  EXPECT_EQ(header_->sync_seq.load(), 0u) << "nothing published yet";
  ASSERT_EQ(sink_->broken().size(), 1u);
  EXPECT_EQ(sink_->broken()[0].epoch, 0u);
  // Stats and the attach reply while no reducer is installed.
  (void)job_->reducer_stats();
  EXPECT_EQ(job_->ResponseFor(0).world_size(), 4);

  std::shared_ptr<FakeReductions> net2;
  Job::ReformationResult r = Result(&net2);
  r.behind = true;
  job_->Reformed(std::move(r));
  ASSERT_TRUE(WaitFor([&] { return header_->sync_seq.load() == 7; }));
  EXPECT_TRUE(job_->status().ok());
  EXPECT_EQ(header_->aborted_iteration.load(), 2u);
  EXPECT_EQ(header_->aborted_rank.load(), -1);
  EXPECT_EQ(Done(0), 2u);
  EXPECT_EQ(Done(1), 2u);
  EXPECT_EQ(header_->aborted_round.load(), 1u);
  EXPECT_EQ(header_->bcast_done_seq.load(), 1u);
  EXPECT_EQ(header_->epoch.load(), 1u);
  EXPECT_EQ(header_->world_size.load(), 2u);
  EXPECT_EQ(header_->state_behind.load(), 1u);
  EXPECT_EQ(job_->epoch(), 1u);
  EXPECT_EQ(job_->iterations_aborted(), 1u);
  ASSERT_EQ(sink_->reformed().size(), 1u);
  const NetworkReformEvent e = sink_->reformed()[0];
  EXPECT_EQ(e.epoch, 1u);
  EXPECT_EQ(e.aborted_iteration, 2u);
  EXPECT_EQ(e.aborted_round, 1u);
  EXPECT_EQ(e.num_nodes, 1);
  EXPECT_EQ(e.world_size, 2);
  EXPECT_THAT(e.lost, ElementsAre("b"));
  const v1::AttachResponse resp = job_->ResponseFor(1);
  EXPECT_EQ(resp.epoch(), 1u);
  // The job's initial world size (what the launcher says); the live one is
  // the control block's.
  EXPECT_EQ(resp.world_size(), 4);
  EXPECT_EQ(resp.num_nodes(), 1);
  EXPECT_EQ(resp.global_rank(), 1);  // global ranks never change
  const JobSnapshot s = job_->Snapshot(false);
  EXPECT_EQ(s.epoch, 1u);
  EXPECT_EQ(s.num_nodes, 1);
  EXPECT_EQ(s.world_size, 2);
  EXPECT_EQ(s.initial_world_size, 4);
  EXPECT_THAT(s.lost_node_ids, ElementsAre("b"));
  EXPECT_THAT(s.last_reformation_reason, HasSubstr("is gone"));

  // Iteration 3 goes to the new reducer, averaged by its own (live) size.
  size_t next2 = 0;
  RunIteration(*net2, 3, &next2);
  EXPECT_EQ(net2->at(0), std::make_pair(0, uint64_t{3}));
  EXPECT_EQ(net2->divisor(0), 0);
  // The hook the job settled on before the break is agreed again on the
  // new group, before its first bucket.
  EXPECT_EQ(net_->agreed_hooks().size(), 1u);
  EXPECT_EQ(net2->agreed_hooks(), net_->agreed_hooks());
  EXPECT_EQ(net_->size(), 4u);
  EXPECT_TRUE(job_->status().ok());
}

// (c) A break with nothing in progress (a node asks to be admitted) aborts
// the next iteration; divide_by_initial_world_size keeps the old divisor.
TEST_F(JobReformationTest, IdleBreakAbortsTheNextIteration) {
  MakeJob({.min_nodes = 2, .divide_by_initial = true});
  size_t next = 0;
  RunIteration(*net_, 1, &next);
  job_->RequestReformation("node 'c' asks to be admitted");
  ASSERT_TRUE(WaitBreaks(1));
  EXPECT_EQ(break_at(0).completed_iteration, 1u);
  EXPECT_EQ(break_at(0).reason, "node 'c' asks to be admitted");
  std::shared_ptr<FakeReductions> net2;
  Job::ReformationResult r = Result(&net2);
  r.num_nodes = 3;
  r.world_size = 6;
  r.node_ids = {"a", "b", "c"};
  r.lost.clear();
  r.admitted = {"c"};
  r.sync_seq = 1;
  job_->Reformed(std::move(r));
  ASSERT_TRUE(WaitFor([&] { return header_->sync_seq.load() == 1; }));
  EXPECT_EQ(header_->aborted_iteration.load(), 2u);
  EXPECT_EQ(Done(0), 2u);
  EXPECT_EQ(Done(1), 2u);
  EXPECT_EQ(header_->world_size.load(), 6u);
  EXPECT_EQ(header_->state_behind.load(), 0u);
  ASSERT_EQ(sink_->reformed().size(), 1u);
  EXPECT_THAT(sink_->reformed()[0].admitted, ElementsAre("c"));
  size_t next2 = 0;
  RunIteration(*net2, 3, &next2);
  EXPECT_EQ(net2->divisor(0), 4);  // the initial world size
  EXPECT_EQ(breaks(), 1u);
}

// A second request while the first break re-forms (the arrival watcher
// saw the same arrival before the manager knew the job was re-forming) is
// dropped: the re-formation under way settles the arrival, and the watcher
// asks again for one it did not. It used to re-form once more, for nothing.
TEST_F(JobReformationTest, ABreakRequestedWhileReFormingIsDropped) {
  MakeJob({.min_nodes = 1});
  size_t next = 0;
  RunIteration(*net_, 1, &next);
  job_->RequestReformation("node 'c' asks to be admitted");
  ASSERT_TRUE(WaitBreaks(1));
  job_->RequestReformation("node 'c' asks to be admitted");
  Settle();
  std::shared_ptr<FakeReductions> net2;
  Job::ReformationResult r = Result(&net2);
  r.sync_seq = 1;
  job_->Reformed(std::move(r));
  ASSERT_TRUE(WaitFor([&] { return header_->sync_seq.load() == 1; }));
  size_t next2 = 0;
  RunIteration(*net2, 3, &next2);
  Settle();
  EXPECT_EQ(breaks(), 1u);
  EXPECT_EQ(job_->epoch(), 1u);
  EXPECT_TRUE(job_->status().ok());
}

// (c') A node admitted into its running job (world size 4 now, 6 when the
// job formed) divides by the initial world size from its first iteration
// and after its own re-formations, and reports it as the initial one.
TEST_F(JobReformationTest, AdmittedNodeDividesByTheInitialWorldSize) {
  MakeJob({.min_nodes = 1, .divide_by_initial = true, .initial_world_size = 6});
  EXPECT_EQ(header_->world_size.load(), 4u);  // the live one
  JobSnapshot s = job_->Snapshot(false);
  EXPECT_EQ(s.world_size, 4);
  EXPECT_EQ(s.initial_world_size, 6);
  size_t next = 0;
  RunIteration(*net_, 1, &next);
  EXPECT_EQ(net_->divisor(0), 6);
  EXPECT_EQ(net_->divisor(1), 6);

  job_->RequestReformation("node 'b' (node rank 1) is gone");
  ASSERT_TRUE(WaitBreaks(1));
  std::shared_ptr<FakeReductions> net2;
  job_->Reformed(Result(&net2));
  ASSERT_TRUE(WaitFor([&] { return header_->sync_seq.load() == 7; }));
  size_t next2 = 0;
  RunIteration(*net2, 3, &next2);
  EXPECT_EQ(net2->divisor(0), 6);
  s = job_->Snapshot(false);
  EXPECT_EQ(s.world_size, 2);
  EXPECT_EQ(s.initial_world_size, 6);
}

// ... and without divide_by_initial_world_size by the live one (the
// reducer's), while still reporting the job's initial world size.
TEST_F(JobReformationTest, AdmittedNodeWithoutDivideByInitialDividesByTheLive) {
  MakeJob({.min_nodes = 1, .initial_world_size = 6});
  size_t next = 0;
  RunIteration(*net_, 1, &next);
  EXPECT_EQ(net_->divisor(0), 0);
  EXPECT_EQ(job_->Snapshot(false).initial_world_size, 6);
}

// (d) A re-formation that fails ends the job with its reason.
TEST_F(JobReformationTest, ReformationErrorFailsTheJob) {
  MakeJob({.min_nodes = 2});
  job_->RequestReformation("node 'b' (node rank 1) is gone");
  ASSERT_TRUE(WaitBreaks(1));
  job_->Reformed(absl::UnavailableError(
      "lost node 'b'; 1 node left, the job needs min_nodes = 2"));
  ASSERT_TRUE(WaitError());
  EXPECT_EQ(job_->status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(job_->status().message(), HasSubstr("lost node 'b'"));
  EXPECT_THAT(job_->status().message(), HasSubstr("min_nodes = 2"));
}

// (e) A rank's return in a multi-node job is one re-formation: the rejoin
// is answered only after Reformed, with the re-formation's sync_seq and a
// single abort.
TEST_F(JobReformationTest,
       RankRestartBreaksTheGroupAndIsAnsweredAfterReformed) {
  MakeJob({.min_nodes = 0, .grace = std::chrono::milliseconds(10000)});
  size_t next = 0;
  RunIteration(*net_, 1, &next);
  // Iteration 2: rank 1 hands bucket 0 over and dies.
  Publish(1, 0, 2);
  Publish(0, 0, 2);
  Publish(0, 1, 2);
  ASSERT_TRUE(net_->WaitStarted(3));
  ASSERT_TRUE(job_->RankRestarting(1, "session closed"));
  auto result = std::make_shared<RejoinResult>();
  job_->RestartRank(1, [result](absl::StatusOr<v1::AttachResponse> r) {
    absl::MutexLock lock(&result->mu);
    result->response = std::move(r);
  });
  Settle();
  EXPECT_EQ(breaks(), 0u) << "bucket 0 is still with the reducer";
  net_->Finish(2, absl::OkStatus());
  ASSERT_TRUE(WaitBreaks(1));
  EXPECT_EQ(break_at(0).reason, "local rank 1 restarted");
  EXPECT_EQ(break_at(0).completed_iteration, 1u);
  Settle();
  EXPECT_FALSE(result->answered());

  std::shared_ptr<FakeReductions> net2;
  Job::ReformationResult r = Result(&net2);
  r.num_nodes = 2;
  r.world_size = 4;
  r.node_ids = {"a", "b"};
  r.lost.clear();
  r.sync_seq = 5;
  job_->Reformed(std::move(r));
  ASSERT_TRUE(result->Wait());
  {
    absl::MutexLock lock(&result->mu);
    ASSERT_TRUE(result->response->ok()) << result->response->status();
    const v1::AttachResponse& resp = **result->response;
    EXPECT_TRUE(resp.restarted());
    EXPECT_EQ(resp.next_iteration(), 3u);
    EXPECT_EQ(resp.collective_seq(), 1u);
    EXPECT_EQ(resp.sync_seq(), 5u);
    EXPECT_EQ(resp.epoch(), 1u);
  }
  EXPECT_EQ(header_->sync_seq.load(), 5u) << "no separate bump for the rank";
  EXPECT_EQ(header_->aborted_iteration.load(), 2u);
  EXPECT_EQ(header_->aborted_rank.load(), -1);
  EXPECT_EQ(job_->iterations_aborted(), 1u);
  EXPECT_EQ(job_->restarts(), 1u);
  EXPECT_FALSE(job_->restarting(1));
  EXPECT_EQ(header_->restarting.load(), 0u);
  EXPECT_EQ(Row(1, 0), 2u);
  EXPECT_EQ(Row(1, 1), 2u);
  EXPECT_EQ(Done(1), 2u);
  EXPECT_EQ(breaks(), 1u);
  // Both ranks go on with iteration 3 on the new group.
  size_t next2 = 0;
  RunIteration(*net2, 3, &next2);
  EXPECT_TRUE(job_->status().ok());
}

// (f) A break with a join in play cannot re-form: the job fails saying so.
TEST_F(JobReformationTest, BreakWithAJoinInPlayFailsTheJob) {
  MakeJob({.min_nodes = 1});
  size_t next = 0;
  RunIteration(*net_, 1, &next);
  JoinSlot* slot = layout_->join_slot(control_.data(), 0);
  slot->begin.store(2);
  slot->join_seq.store(1, std::memory_order_release);
  job_->RequestReformation("node 'c' asks to be admitted");
  ASSERT_TRUE(WaitError());
  EXPECT_EQ(job_->status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(job_->status().message(), HasSubstr("join"));
  EXPECT_THAT(job_->status().message(),
              HasSubstr("elastic re-formation does not run"));
  Settle();
  EXPECT_EQ(breaks(), 0u);
}

// A collective round that fails on the network breaks the group like a
// bucket: the re-formation aborts that round (and the next iteration, none
// being in progress), and the next round goes to the new reducer.
TEST_F(JobReformationTest, RoundInFlightAtTheBreakIsAborted) {
  MakeJob({.min_nodes = 1});
  auto round = [&](uint64_t seq) {
    for (int r = 0; r < 2; ++r) {
      BroadcastSlot* slot = layout_->bcast(control_.data(), r);
      slot->root.store(0);
      slot->bytes.store(16);
      slot->kind.store(static_cast<int32_t>(CollectiveKind::kBroadcast));
      slot->ready_seq.store(seq, std::memory_order_release);
      RingDaemon(header_, layout_->rank_header(control_.data(), r), bells_[r]);
    }
  };
  round(1);
  ASSERT_TRUE(net_->WaitStarted(1));
  net_->Finish(0, absl::UnavailableError("node 'b' (node rank 1) is gone"));
  ASSERT_TRUE(WaitBreaks(1));
  EXPECT_EQ(break_at(0).completed_iteration, 0u);
  EXPECT_EQ(header_->bcast_done_seq.load(), 0u);
  std::shared_ptr<FakeReductions> net2;
  job_->Reformed(Result(&net2));
  ASSERT_TRUE(WaitFor([&] { return header_->sync_seq.load() == 7; }));
  EXPECT_EQ(header_->aborted_round.load(), 1u);
  EXPECT_EQ(header_->bcast_done_seq.load(), 1u);
  EXPECT_EQ(header_->aborted_iteration.load(), 1u);
  EXPECT_EQ(Done(0), 1u);
  ASSERT_EQ(sink_->reformed().size(), 1u);
  EXPECT_EQ(sink_->reformed()[0].aborted_round, 1u);
  round(2);
  ASSERT_TRUE(net2->WaitStarted(1));
  EXPECT_EQ(net2->at(0).second, 2u);
  net2->Finish(0, absl::OkStatus());
  ASSERT_TRUE(WaitFor([&] { return header_->bcast_done_seq.load() == 2; }));
  EXPECT_TRUE(job_->status().ok());
}

// After a node was lost, a join (its rounds count the initial ranks)
// fails clearly instead of disagreeing with the other nodes.
TEST_F(JobReformationTest, JoinAfterANodeWasLostFailsClearly) {
  MakeJob({.min_nodes = 1});
  job_->RequestReformation("node 'b' (node rank 1) is gone");
  ASSERT_TRUE(WaitBreaks(1));
  std::shared_ptr<FakeReductions> net2;
  job_->Reformed(Result(&net2));
  ASSERT_TRUE(WaitFor([&] { return header_->sync_seq.load() == 7; }));
  JoinSlot* slot = layout_->join_slot(control_.data(), 0);
  slot->begin.store(2);
  slot->join_seq.store(1, std::memory_order_release);
  RingDaemon(header_, me_, bells_[0]);
  ASSERT_TRUE(WaitError());
  EXPECT_EQ(job_->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(job_->status().message(),
              HasSubstr("join (uneven inputs) is not supported after a node "
                        "was lost or admitted"));
}

// No handler: a break cannot be re-formed and the job fails.
TEST_F(JobReformationTest, BreakWithoutAHandlerFailsTheJob) {
  MakeJob({.min_nodes = 1, .handler = false});
  job_->RequestReformation("node 'b' (node rank 1) is gone");
  ASSERT_TRUE(WaitError());
  EXPECT_THAT(job_->status().message(), HasSubstr("nothing re-forms it"));
}

}  // namespace
}  // namespace gradd
