// RankStates and RankRestartInbox driven by hand: the test plays the job
// manager's thread (ranks leaving, restarting, attaching again) and the
// engine thread (taking the returns, ending restarts).
#include "server/engine/job/rank_states.h"

#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace gradd {
namespace {

TEST(RankStatesTest, StartsLive) {
  RankStates ranks(3);
  EXPECT_EQ(ranks.world(), 3);
  EXPECT_TRUE(ranks.all_live());
  EXPECT_EQ(ranks.live_count(), 3);
  EXPECT_EQ(ranks.restarting_count(), 0);
  EXPECT_EQ(ranks.TakeRestartSince(1), 0);
}

TEST(RankStatesTest, GoneIsFinal) {
  RankStates ranks(2);
  EXPECT_EQ(ranks.Gone(0, /*detached=*/true), RankStates::kLive);
  EXPECT_EQ(ranks.state(0), RankStates::kDetached);
  EXPECT_FALSE(ranks.all_live());
  // Gone again: stays as it is, says so.
  EXPECT_EQ(ranks.Gone(0, /*detached=*/false), RankStates::kDetached);
  EXPECT_EQ(ranks.state(0), RankStates::kDetached);
  // A gone rank does not restart.
  EXPECT_FALSE(ranks.BeginRestart(0, 5));
  EXPECT_EQ(ranks.Gone(1, /*detached=*/false), RankStates::kLive);
  EXPECT_EQ(ranks.state(1), RankStates::kDisconnected);
  EXPECT_EQ(ranks.live_count(), 0);
}

TEST(RankStatesTest, RestartAndReturn) {
  RankStates ranks(2);
  ASSERT_TRUE(ranks.BeginRestart(1, 1000));
  EXPECT_TRUE(ranks.restarting(1));
  EXPECT_FALSE(ranks.live(1));
  EXPECT_EQ(ranks.restarting_count(), 1);
  EXPECT_EQ(ranks.live_count(), 1);
  EXPECT_FALSE(ranks.BeginRestart(1, 2000));  // already restarting
  ASSERT_TRUE(ranks.EndRestart(1));
  EXPECT_TRUE(ranks.all_live());
  EXPECT_EQ(ranks.TakeRestartSince(1), 1000);
  EXPECT_EQ(ranks.TakeRestartSince(1), 0);  // taken once
  EXPECT_FALSE(ranks.EndRestart(1));        // not restarting
}

TEST(RankStatesTest, GraceOverBeforeTheReturn) {
  RankStates ranks(1);
  ASSERT_TRUE(ranks.BeginRestart(0, 1000));
  // The manager's grace runs out: the restarting rank is gone.
  EXPECT_EQ(ranks.Gone(0, /*detached=*/false), RankStates::kRestarting);
  EXPECT_FALSE(ranks.EndRestart(0));
  EXPECT_EQ(ranks.state(0), RankStates::kDisconnected);
}

TEST(RankStatesTest, ReturnAndGoneRaceOneWinner) {
  for (int i = 0; i < 200; ++i) {
    RankStates ranks(1);
    ASSERT_TRUE(ranks.BeginRestart(0, 1));
    bool back = false;
    RankStates::State left = RankStates::kLive;
    std::thread engine([&] { back = ranks.EndRestart(0); });
    std::thread manager([&] { left = ranks.Gone(0, false); });
    engine.join();
    manager.join();
    // Either the rank came back and then left live, or it left while
    // restarting and never came back.
    EXPECT_EQ(back, left == RankStates::kLive);
    EXPECT_EQ(ranks.state(0), RankStates::kDisconnected);
  }
}

using Answer = absl::StatusOr<v1::AttachResponse>;

class RankRestartInboxTest : public ::testing::Test {
 protected:
  RankRestartDone Record(int rank) {
    return [this, rank](Answer a) {
      answers_.push_back({rank, a.ok() ? absl::OkStatus() : a.status()});
    };
  }

  std::atomic<int> wakes_{0};
  RankRestartInbox inbox_{[this] { wakes_.fetch_add(1); }};
  std::vector<std::pair<int, absl::Status>> answers_;
};

TEST_F(RankRestartInboxTest, PostedFromAnotherThreadTakenInOrder) {
  EXPECT_FALSE(inbox_.pending());
  std::thread manager([&] {
    inbox_.Post(1, Record(1));
    inbox_.Post(0, Record(0));
  });
  manager.join();
  EXPECT_EQ(wakes_.load(), 2);
  ASSERT_TRUE(inbox_.pending());
  std::vector<RankRestartInbox::Request> taken = inbox_.TakeAll();
  EXPECT_FALSE(inbox_.pending());
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].rank, 1);
  EXPECT_EQ(taken[1].rank, 0);
  EXPECT_TRUE(answers_.empty());  // the engine answers what it took
  for (auto& r : taken) std::move(r.done)(v1::AttachResponse());
  ASSERT_EQ(answers_.size(), 2u);
  EXPECT_TRUE(answers_[0].second.ok());
  EXPECT_TRUE(inbox_.TakeAll().empty());
}

TEST_F(RankRestartInboxTest, FailAllAnswersEveryOneWaiting) {
  inbox_.Post(0, Record(0));
  inbox_.Post(1, Record(1));
  inbox_.FailAll(absl::AbortedError("job failed"));
  EXPECT_FALSE(inbox_.pending());
  ASSERT_EQ(answers_.size(), 2u);
  EXPECT_EQ(answers_[0].first, 0);
  EXPECT_EQ(answers_[1].second.code(), absl::StatusCode::kAborted);
  // The inbox stays open: a failed job's engine answers later ones too.
  inbox_.Post(1, Record(1));
  EXPECT_TRUE(inbox_.pending());
}

TEST_F(RankRestartInboxTest, AfterCloseAPostIsAnsweredAtOnce) {
  inbox_.Post(0, Record(0));
  inbox_.Close(absl::CancelledError("job stopped"));
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_EQ(answers_[0].second.code(), absl::StatusCode::kCancelled);
  const int wakes = wakes_.load();
  inbox_.Post(1, Record(1));
  ASSERT_EQ(answers_.size(), 2u);
  EXPECT_EQ(answers_[1].first, 1);
  EXPECT_EQ(answers_[1].second.message(), "job stopped");
  EXPECT_EQ(wakes_.load(), wakes);
  EXPECT_FALSE(inbox_.pending());
}

}  // namespace
}  // namespace gradd
