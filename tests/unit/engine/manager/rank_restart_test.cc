// Rank restart (issue 23; common/control_block.h "Rank restart"): a local
// rank whose session closes without Detach is waited for, attaches again and
// the engine aborts what could not complete. JobManager + Job driven through
// the handler interface with a fake session registry, ranks acting on the
// real control block and bucket memory, as in job_manager_test.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config.h"
#include "server/engine/manager/attach_validation.h"
#include "tests/unit/engine/manager/job_manager_fixture.h"
#include "tests/unit/engine/manager/test_rank.h"

namespace gradd {
namespace {

// Two buckets of 1000 floats each.
const std::vector<TestParam> kModel = {{"a", {1000}, v1::FLOAT32},
                                       {"b", {1000}, v1::FLOAT32}};
constexpr double kCapMb = 0.002;

class RankRestartTest : public JobManagerFixture {
 protected:
  void SetUp() override {
    JobManagerFixture::SetUp();
    config_.set_rank_restart_grace_ms(10000);
  }

  v1::AttachRequest Request(const std::string& job, int rank, int world,
                            uint64_t session,
                            const std::vector<TestParam>& params = kModel) {
    v1::AttachRequest req = MakeRequest(job, rank, world, session, params);
    req.set_bucket_cap_mb(kCapMb);
    req.set_first_bucket_cap_mb(kCapMb);
    req.set_broadcast_bytes(4096);
    return req;
  }

  std::vector<std::unique_ptr<TestRank>> Start(const std::string& job,
                                               int world) {
    std::vector<std::unique_ptr<TestRank>> ranks =
        AttachJob(job, world, kModel, kCapMb, kCapMb, /*broadcast_bytes=*/4096);
    EXPECT_EQ(ranks.size(), static_cast<size_t>(world));
    if (!ranks.empty()) {
      EXPECT_EQ(ranks[0]->response().buckets_size(), 2);
    }
    return ranks;
  }

  // Attaches local rank `rank` again on a new session; the rank as its new
  // process sees it, or null (the Attach's error in *status).
  std::unique_ptr<TestRank> Reattach(const std::string& job, int rank,
                                     int world, absl::Status* status,
                                     v1::AttachRequest* custom = nullptr) {
    const uint64_t session = sessions_.Open();
    v1::AttachRequest req =
        custom != nullptr ? *custom : Request(job, rank, world, session);
    req.set_session_id(session);
    absl::StatusOr<v1::AttachResponse> resp =
        StartAttach(manager(), std::move(req))->Get();
    *status = resp.status();
    if (!resp.ok()) return nullptr;
    FakeSessionRegistry::Sent sent = sessions_.TakeSent(session);
    EXPECT_EQ(sent.attach_id, resp->attach_id());
    EXPECT_EQ(sent.fds.size(), 4u);
    return std::make_unique<TestRank>(rank, session, *resp, std::move(sent));
  }

  static void Fill(TestRank& r, int b, float v) {
    float* p = reinterpret_cast<float*>(r.bucket(b));
    for (int i = 0; i < 1000; ++i) p[i] = v;
  }
  static float First(TestRank& r, int b) {
    return reinterpret_cast<const float*>(r.bucket(b))[0];
  }
  // The process of `r` dies: its session closes, its mappings go.
  void Kill(std::unique_ptr<TestRank>& r) {
    sessions_.Close(r->session());
    r.reset();
  }
  // Some time for the engine and the control loop to (not) act.
  static void Settle() {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
};

TEST_F(RankRestartTest, FreshAttachTellsTheGraceAndTheFirstIteration) {
  auto ranks = Start("fresh", 2);
  ASSERT_EQ(ranks.size(), 2u);
  const v1::AttachResponse& resp = ranks[1]->response();
  EXPECT_EQ(resp.rank_restart_grace_ms(), 10000u);
  EXPECT_FALSE(resp.restarted());
  EXPECT_EQ(resp.next_iteration(), 1u);
  EXPECT_EQ(resp.collective_seq(), 0u);
  EXPECT_EQ(resp.sync_seq(), 0u);
}

TEST_F(RankRestartTest, DeathMidIterationWaitsThenRejoinAbortsIt) {
  auto ranks = Start("mid", 2);
  ASSERT_EQ(ranks.size(), 2u);
  for (auto& r : ranks) {
    Fill(*r, 0, 1.0f + r->rank());
    Fill(*r, 1, 1.0f + r->rank());
    r->Publish(0, 1);
    r->Publish(1, 1);
  }
  for (auto& r : ranks) ASSERT_TRUE(r->WaitAllDone(1)) << r->Error();

  // Iteration 2: rank 1 hands over bucket 0 and dies; rank 0 hands over
  // both. Bucket 0 completes (rank 1's memory is still mapped by the
  // daemon); bucket 1 waits for rank 1 without an error.
  Fill(*ranks[0], 1, 5.0f);
  ranks[1]->Publish(0, 2);
  Kill(ranks[1]);
  ranks[0]->Publish(0, 2);
  ranks[0]->Publish(1, 2);
  EXPECT_FALSE(ranks[0]->WaitAllDone(2, std::chrono::milliseconds(300)));
  EXPECT_TRUE(ranks[0]->Error().ok()) << ranks[0]->Error();
  EXPECT_EQ(ranks[0]->Done(0), 2u);
  EXPECT_EQ(ranks[0]->Done(1), 1u);
  EXPECT_EQ(ranks[0]->header()->restarting.load(), 1u);
  EXPECT_EQ(ranks[0]->header()->aborted_iteration.load(), 0u);

  absl::Status status;
  std::unique_ptr<TestRank> back = Reattach("mid", 1, 2, &status);
  ASSERT_TRUE(status.ok()) << status;
  const v1::AttachResponse& resp = back->response();
  EXPECT_TRUE(resp.restarted());
  EXPECT_EQ(resp.next_iteration(), 3u);
  // No round was in progress: the next one (1) is aborted, so a survivor's
  // next round and the rejoiner's state sync cannot meet in one round.
  EXPECT_EQ(resp.collective_seq(), 1u);
  EXPECT_EQ(resp.sync_seq(), 1u);
  EXPECT_EQ(resp.rank_restart_grace_ms(), 10000u);
  EXPECT_EQ(resp.buckets_size(), 2);

  // The survivor sees iteration 2 done, and aborted.
  ASSERT_TRUE(ranks[0]->WaitAllDone(2)) << ranks[0]->Error();
  ControlHeader* h = ranks[0]->header();
  EXPECT_EQ(h->aborted_iteration.load(), 2u);
  EXPECT_EQ(h->aborted_rank.load(), 1);
  EXPECT_EQ(h->sync_seq.load(), 1u);
  EXPECT_EQ(h->restarts.load(), 1u);
  EXPECT_EQ(h->restarting.load(), 0u);
  // The rejoiner's rows read "done with iteration 2".
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(back->layout().ready_row(back->control_base(), 1)[b].load(
                  std::memory_order_acquire),
              2u);
  }
  // Bucket 1 of iteration 2 was not reduced: rank 0's values are its own.
  EXPECT_EQ(First(*ranks[0], 1), 5.0f);

  // Iteration 3 runs with both, in the same memory (the rejoiner's bell
  // still reaches the engine).
  Fill(*ranks[0], 0, 2.0f);
  Fill(*ranks[0], 1, 2.0f);
  Fill(*back, 0, 4.0f);
  Fill(*back, 1, 4.0f);
  for (int b = 0; b < 2; ++b) {
    ranks[0]->Publish(b, 3);
    back->Publish(b, 3);
  }
  ASSERT_TRUE(ranks[0]->WaitAllDone(3)) << ranks[0]->Error();
  ASSERT_TRUE(back->WaitAllDone(3)) << back->Error();
  EXPECT_EQ(First(*ranks[0], 1), 3.0f);
  EXPECT_EQ(First(*back, 0), 3.0f);
  EXPECT_EQ(h->aborted_iteration.load(), 2u);  // 3 was not aborted

  // The admin view shows the job's restart figures.
  auto snaps = manager().Snapshot(absl::Now() + absl::Seconds(10), false);
  ASSERT_TRUE(snaps.ok());
  ASSERT_EQ(snaps->size(), 1u);
  EXPECT_EQ((*snaps)[0].restarts, 1u);
  EXPECT_EQ((*snaps)[0].iterations_aborted, 1u);
  EXPECT_EQ((*snaps)[0].rank_restart_grace_ms, 10000u);
}

TEST_F(RankRestartTest, DeathAfterHandingOverEverythingAbortsTheNextOne) {
  auto ranks = Start("after", 2);
  ASSERT_EQ(ranks.size(), 2u);
  // Rank 1 hands over all of iteration 1 and dies; iteration 1 completes.
  Fill(*ranks[0], 0, 1.0f);
  Fill(*ranks[1], 0, 3.0f);
  ranks[1]->Publish(0, 1);
  ranks[1]->Publish(1, 1);
  Kill(ranks[1]);
  Settle();
  ranks[0]->Publish(0, 1);
  ranks[0]->Publish(1, 1);
  ASSERT_TRUE(ranks[0]->WaitAllDone(1)) << ranks[0]->Error();
  EXPECT_EQ(First(*ranks[0], 0), 2.0f);
  EXPECT_EQ(ranks[0]->header()->aborted_iteration.load(), 0u);

  // Iteration 2 waits for it.
  ranks[0]->Publish(0, 2);
  ranks[0]->Publish(1, 2);
  EXPECT_FALSE(ranks[0]->WaitAllDone(2, std::chrono::milliseconds(300)));
  EXPECT_TRUE(ranks[0]->Error().ok()) << ranks[0]->Error();

  absl::Status status;
  std::unique_ptr<TestRank> back = Reattach("after", 1, 2, &status);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(back->response().next_iteration(), 3u);
  ASSERT_TRUE(ranks[0]->WaitAllDone(2)) << ranks[0]->Error();
  EXPECT_EQ(ranks[0]->header()->aborted_iteration.load(), 2u);
}

// Nothing in progress when the rank comes back: the next iteration is
// aborted all the same (every bucket done for it at once), the one point
// every rank agrees on whether it checked for the state sync before the
// rejoin or after it.
TEST_F(RankRestartTest, IdleDeathAbortsTheNextIteration) {
  auto ranks = Start("idle", 2);
  ASSERT_EQ(ranks.size(), 2u);
  for (auto& r : ranks) {
    r->Publish(0, 1);
    r->Publish(1, 1);
  }
  for (auto& r : ranks) ASSERT_TRUE(r->WaitAllDone(1));
  Kill(ranks[1]);
  Settle();
  absl::Status status;
  std::unique_ptr<TestRank> back = Reattach("idle", 1, 2, &status);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(back->response().next_iteration(), 3u);
  EXPECT_EQ(back->header()->aborted_iteration.load(), 2u);
  EXPECT_EQ(back->header()->aborted_round.load(), 1u);
  EXPECT_EQ(back->header()->sync_seq.load(), 1u);
  // The survivor's iteration 2 (handed over after the rejoin) is done and
  // aborted at once, without the rejoiner.
  ranks[0]->Publish(0, 2);
  ranks[0]->Publish(1, 2);
  EXPECT_TRUE(ranks[0]->WaitAllDone(2)) << ranks[0]->Error();
  EXPECT_EQ(ranks[0]->header()->aborted_iteration.load(), 2u);
  EXPECT_TRUE(ranks[0]->Error().ok()) << ranks[0]->Error();
  // Iteration 3 runs with both and is not aborted.
  Fill(*ranks[0], 0, 1.0f);
  Fill(*back, 0, 3.0f);
  for (int b = 0; b < 2; ++b) {
    ranks[0]->Publish(b, 3);
    back->Publish(b, 3);
  }
  ASSERT_TRUE(ranks[0]->WaitAllDone(3)) << ranks[0]->Error();
  ASSERT_TRUE(back->WaitAllDone(3)) << back->Error();
  EXPECT_EQ(First(*back, 0), 2.0f);
  EXPECT_EQ(ranks[0]->header()->aborted_iteration.load(), 2u);
}

TEST_F(RankRestartTest, CollectiveRoundInProgressIsAborted) {
  auto ranks = Start("coll", 2);
  ASSERT_EQ(ranks.size(), 2u);
  ranks[0]->PublishBroadcast(1, 0, 64);
  ranks[1]->PublishBroadcast(1, 0, 64);
  ASSERT_TRUE(ranks[0]->WaitBroadcast(1));
  // Round 2: rank 0 enters it, rank 1 dies before.
  Kill(ranks[1]);
  ranks[0]->PublishBroadcast(2, 0, 64);
  Settle();
  EXPECT_EQ(ranks[0]->header()->bcast_done_seq.load(), 1u);
  EXPECT_TRUE(ranks[0]->Error().ok()) << ranks[0]->Error();

  absl::Status status;
  std::unique_ptr<TestRank> back = Reattach("coll", 1, 2, &status);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(back->response().collective_seq(), 2u);
  // No gradient iteration was in progress: the next one (1) is aborted.
  EXPECT_EQ(back->response().next_iteration(), 2u);
  ASSERT_TRUE(ranks[0]->WaitBroadcast(2)) << ranks[0]->Error();
  EXPECT_EQ(ranks[0]->header()->aborted_round.load(), 2u);
  EXPECT_EQ(ranks[0]->header()->aborted_iteration.load(), 1u);
  EXPECT_EQ(back->layout()
                .bcast(back->control_base(), 1)
                ->ready_seq.load(std::memory_order_acquire),
            2u);
  // Round 3 runs with both.
  std::memcpy(ranks[0]->broadcast_area(), "hello", 6);
  ranks[0]->PublishBroadcast(3, 0, 6);
  back->PublishBroadcast(3, 0, 6);
  ASSERT_TRUE(back->WaitBroadcast(3)) << back->Error();
  EXPECT_STREQ(back->broadcast_area(), "hello");
}

TEST_F(RankRestartTest, GraceExpiryFailsTheJobNamingTheRank) {
  config_.set_rank_restart_grace_ms(300);
  auto ranks = Start("late", 2);
  ASSERT_EQ(ranks.size(), 2u);
  ranks[0]->Publish(0, 1);
  Kill(ranks[1]);
  EXPECT_FALSE(ranks[0]->WaitAllDone(1, std::chrono::seconds(10)));
  EXPECT_THAT(ranks[0]->Error(),
              StatusIs(absl::StatusCode::kAborted,
                       "local rank 1 of job 'late' did not re-attach within "
                       "rank_restart_grace_ms=300 after its process went "
                       "away"));
  // Too late: the rank is gone, a new Attach is refused as for any
  // running job.
  absl::Status status;
  EXPECT_EQ(Reattach("late", 1, 2, &status), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
}

TEST_F(RankRestartTest, EveryRankAwayWaitsThenExpires) {
  config_.set_rank_restart_grace_ms(400);
  auto ranks = Start("all", 2);
  ASSERT_EQ(ranks.size(), 2u);
  Kill(ranks[0]);
  Kill(ranks[1]);
  Settle();
  EXPECT_EQ(manager().NumJobs(), 1);  // waits, memory kept
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_EQ(manager().NumJobs(), 0);  // grace over: the job ended
}

TEST_F(RankRestartTest, MismatchedModelIsRefusedAndTheJobKeepsWaiting) {
  auto ranks = Start("mm", 2);
  ASSERT_EQ(ranks.size(), 2u);
  ranks[0]->Publish(0, 1);
  ranks[0]->Publish(1, 1);
  Kill(ranks[1]);

  v1::AttachRequest wrong = Request(
      "mm", 1, 2, 0, {{"a", {1000}, v1::FLOAT32}, {"b", {999}, v1::FLOAT32}});
  absl::Status status;
  EXPECT_EQ(Reattach("mm", 1, 2, &status, &wrong), nullptr);
  EXPECT_THAT(status,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "local rank 1 of job 'mm' re-attached with a different "
                       "model than the job runs: parameter 1 is 'b' [1000]"));
  v1::AttachRequest world = Request("mm", 1, 3, 0);
  EXPECT_EQ(Reattach("mm", 1, 3, &status, &world), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  v1::AttachRequest area = Request("mm", 1, 2, 0);
  area.set_broadcast_bytes(8192);
  EXPECT_EQ(Reattach("mm", 1, 2, &status, &area), nullptr);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                               "broadcast/collective area of 8192 bytes"));
  EXPECT_TRUE(ranks[0]->Error().ok()) << ranks[0]->Error();

  // The right one is taken back; iteration 1 is aborted.
  std::unique_ptr<TestRank> back = Reattach("mm", 1, 2, &status);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_TRUE(ranks[0]->WaitAllDone(1)) << ranks[0]->Error();
  EXPECT_EQ(ranks[0]->header()->aborted_iteration.load(), 1u);
}

TEST_F(RankRestartTest, AttachQuickerThanTheNewsOfTheOldSessionsEnd) {
  auto ranks = Start("quick", 2);
  ASSERT_EQ(ranks.size(), 2u);
  ranks[0]->Publish(0, 1);
  const uint64_t old_session = ranks[1]->session();
  sessions_.CloseQuietly(old_session);
  ranks[1].reset();
  absl::Status status;
  std::unique_ptr<TestRank> back = Reattach("quick", 1, 2, &status);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(back->response().restarted());
  sessions_.NotifyClosed(old_session);  // late news: nothing more happens
  ASSERT_TRUE(ranks[0]->WaitAllDone(1)) << ranks[0]->Error();
  EXPECT_EQ(ranks[0]->header()->aborted_iteration.load(), 1u);
  Settle();
  EXPECT_TRUE(ranks[0]->Error().ok()) << ranks[0]->Error();
  EXPECT_EQ(ranks[0]->header()->restarting.load(), 0u);
}

TEST_F(RankRestartTest, LiveRankAttachIsStillRefused) {
  auto ranks = Start("live", 2);
  ASSERT_EQ(ranks.size(), 2u);
  absl::Status status;
  EXPECT_EQ(Reattach("live", 1, 2, &status), nullptr);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kAlreadyExists,
                               "local rank 1 of job 'live' is already"));
}

TEST_F(RankRestartTest, GraceZeroKeepsTheFastAbort) {
  config_.set_rank_restart_grace_ms(0);
  auto ranks = Start("zero", 2);
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks[0]->response().rank_restart_grace_ms(), 0u);
  ranks[0]->Publish(0, 1);
  Kill(ranks[1]);
  EXPECT_FALSE(ranks[0]->WaitAllDone(1, std::chrono::seconds(10)));
  EXPECT_THAT(ranks[0]->Error(),
              StatusIs(absl::StatusCode::kAborted,
                       "local rank 1 of job 'zero' disconnected during "
                       "iteration 1"));
}

TEST_F(RankRestartTest, DeathWithAJoinInPlayFailsAsBefore) {
  auto ranks = Start("join", 2);
  ASSERT_EQ(ranks.size(), 2u);
  for (auto& r : ranks) {
    r->Publish(0, 1);
    r->Publish(1, 1);
  }
  for (auto& r : ranks) ASSERT_TRUE(r->WaitAllDone(1));
  // Rank 0 enters join mode (common/control_block.h, "Join"), then rank 1
  // dies: the join's rounds count the ranks, so the job fails at once.
  JoinSlot* slot = ranks[0]->layout().join_slot(ranks[0]->control_base(), 0);
  slot->begin.store(2, std::memory_order_relaxed);
  slot->join_seq.store(1, std::memory_order_release);
  Kill(ranks[1]);
  EXPECT_FALSE(ranks[0]->WaitAllDone(2, std::chrono::seconds(10)));
  EXPECT_THAT(ranks[0]->Error(),
              StatusIs(absl::StatusCode::kAborted,
                       "local rank 1 (global rank 1) of job 'join' left"));
  EXPECT_EQ(ranks[0]->header()->restarting.load(), 0u);
}

TEST_F(RankRestartTest, DeathWithARebuildPendingFailsAsBefore) {
  auto ranks = Start("rebuild", 2);
  ASSERT_EQ(ranks.size(), 2u);
  for (auto& r : ranks) {
    r->Publish(0, 1);
    r->Publish(1, 1);
  }
  for (auto& r : ranks) ASSERT_TRUE(r->WaitAllDone(1));
  // Rank 0 asks for the bucket rebuild after iteration 1; rank 1 dies
  // before asking: it is gone, and the rebuild fails naming it.
  v1::RebuildBucketsRequest req;
  req.set_job_id("rebuild");
  req.set_local_rank(0);
  req.set_session_id(ranks[0]->session());
  req.set_iteration(1);
  req.add_ready_order(1);
  req.add_ready_order(0);
  absl::Notification answered;
  absl::Status rebuild;
  manager().HandleRebuildBuckets(
      std::move(req), absl::Now() + absl::Seconds(20),
      [&](absl::StatusOr<v1::RebuildBucketsResponse> r) {
        rebuild = r.status();
        answered.Notify();
      });
  Settle();
  Kill(ranks[1]);
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_THAT(rebuild, StatusIs(absl::StatusCode::kAborted, "local rank 1"));
  auto snaps = manager().Snapshot(absl::Now() + absl::Seconds(10), false);
  ASSERT_TRUE(snaps.ok());
  ASSERT_EQ(snaps->size(), 1u);
  EXPECT_EQ((*snaps)[0].ranks[1].state, RankSnapshot::State::kDisconnected);
}

TEST_F(RankRestartTest, PerJobGraceWinsOverTheDaemons) {
  config_.set_rank_restart_grace_ms(0);
  std::vector<std::shared_ptr<PendingAttach>> pending;
  std::vector<uint64_t> sessions;
  for (int r = 0; r < 2; ++r) {
    sessions.push_back(sessions_.Open());
    v1::AttachRequest req = Request("own", r, 2, sessions.back());
    req.set_rank_restart_grace_ms(5000);
    pending.push_back(StartAttach(manager(), std::move(req)));
  }
  for (auto& p : pending) {
    absl::StatusOr<v1::AttachResponse> resp = p->Get();
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->rank_restart_grace_ms(), 5000u);
  }
}

TEST_F(RankRestartTest, LocalRanksMustAgreeOnTheGrace) {
  std::vector<std::shared_ptr<PendingAttach>> pending;
  for (int r = 0; r < 2; ++r) {
    v1::AttachRequest req = Request("agree", r, 2, sessions_.Open());
    if (r == 1) req.set_rank_restart_grace_ms(5000);
    pending.push_back(StartAttach(manager(), std::move(req)));
  }
  for (auto& p : pending) {
    EXPECT_THAT(p->Get().status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "local ranks 0 and 1 of job 'agree' asked for "
                         "different rank_restart_grace_ms (10000 (the "
                         "daemon's default) vs 5000)"));
  }
}

TEST(RankRestartValidation, MultiNodeJobsTakeAGraceToo) {
  v1::DaemonConfig config = DefaultConfig();
  config.set_rank_restart_grace_ms(7000);
  v1::AttachRequest req = MakeRequest("multi", 0, 1, 1, kModel);
  req.set_num_nodes(2);
  // The daemon's default applies to multi-node jobs now (the nodes re-form
  // around a restarting rank, control_block.h "Re-formation").
  EXPECT_EQ(EffectiveRankRestartGrace(req, config), 7000u);
  req.set_rank_restart_grace_ms(1000);
  EXPECT_TRUE(ValidateAttachRequest(req, config).ok());
  EXPECT_EQ(EffectiveRankRestartGrace(req, config), 1000u);
  req.set_rank_restart_grace_ms(0);
  EXPECT_TRUE(ValidateAttachRequest(req, config).ok());
  EXPECT_EQ(EffectiveRankRestartGrace(req, config), 0u);
  req.set_num_nodes(1);
  req.clear_rank_restart_grace_ms();
  EXPECT_EQ(EffectiveRankRestartGrace(req, config), 7000u);
  req.set_rank_restart_grace_ms(3600001);
  EXPECT_THAT(ValidateAttachRequest(req, config).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "rank_restart_grace_ms 3600001 is above 3600000"));
}

TEST(RankRestartValidation, ConfigBoundsTheGrace) {
  v1::DaemonConfig config = DefaultConfig();
  config.set_rank_restart_grace_ms(3600000);
  EXPECT_TRUE(ValidateConfig(config).ok());
  config.set_rank_restart_grace_ms(3600001);
  EXPECT_THAT(ValidateConfig(config),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "rank_restart_grace_ms = 3600001 is above 3600000"));
  absl::StatusOr<v1::DaemonConfig> parsed =
      ParseConfigYaml("rank_restart_grace_ms: 5000\n", "<string>");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->rank_restart_grace_ms(), 5000u);
}

TEST(RankRestartTimeline, RestartEventsReachTheTimeline) {
  Timeline timeline(16);
  RankRestartEvent e;
  e.local_rank = 1;
  e.since_ns = EngineNowNs();
  e.at_ns = e.since_ns;
  timeline.OnRankRestarting(e);
  e.at_ns = e.since_ns + 5'000'000;
  e.aborted_iteration = 4;
  e.aborted_round = 2;
  timeline.OnRankRestarted(e);
  std::vector<TimelineEvent> events = timeline.Snapshot();
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].phase, "restarting");
  EXPECT_EQ(events[0].local_rank, 1);
  EXPECT_EQ(events[1].phase, "rank_restarted");
  EXPECT_EQ(events[1].duration_ns, 5'000'000);
  EXPECT_EQ(events[2].phase, "iteration_aborted");
  EXPECT_EQ(events[2].iteration, 4u);
  EXPECT_EQ(events[2].local_rank, -1);
  EXPECT_EQ(events[3].phase, "round_aborted");
  EXPECT_EQ(events[3].iteration, 2u);
}

}  // namespace
}  // namespace gradd
