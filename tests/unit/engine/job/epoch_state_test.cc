// EpochState driven by hand: breaks, drains and re-formation results in,
// stages out (no Job, no threads); the engine clock is a plain number.
#include "server/engine/job/epoch_state.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using Stage = EpochState::Stage;

TEST(EpochStateTest, StartsRunning) {
  EpochState epoch(/*enabled=*/true);
  EXPECT_EQ(epoch.stage(), Stage::kRunning);
  EXPECT_TRUE(epoch.running());
  EXPECT_FALSE(epoch.under_way());
  EXPECT_FALSE(epoch.TakeResult());
  EXPECT_EQ(epoch.ElapsedMs(5'000'000'000), 0);
}

TEST(EpochStateTest, FullCycleBackToRunning) {
  EpochState epoch(true);
  ASSERT_TRUE(epoch.Break("bucket 0 iteration 7: connection reset",
                          /*now_ns=*/1'000'000'000));
  EXPECT_EQ(epoch.stage(), Stage::kDraining);
  EXPECT_TRUE(epoch.under_way());
  EXPECT_EQ(epoch.reason(), "bucket 0 iteration 7: connection reset");
  EXPECT_EQ(epoch.broke_ns(), 1'000'000'000);
  // A result before the group re-forms is not taken.
  EXPECT_FALSE(epoch.TakeResult());

  // Work still with the reducer: no move.
  EXPECT_FALSE(epoch.Drained(/*in_flight=*/2));
  EXPECT_EQ(epoch.stage(), Stage::kDraining);
  ASSERT_TRUE(epoch.Drained(0));
  EXPECT_EQ(epoch.stage(), Stage::kReforming);
  EXPECT_TRUE(epoch.TakeResult());
  EXPECT_EQ(epoch.ElapsedMs(1'250'000'000), 250);

  epoch.Resume();
  EXPECT_EQ(epoch.stage(), Stage::kRunning);
  EXPECT_FALSE(epoch.TakeResult());
  // The last break's reason stays readable after it.
  EXPECT_EQ(epoch.reason(), "bucket 0 iteration 7: connection reset");
}

TEST(EpochStateTest, BreakUnderWayKeepsFirstReasonAndTime) {
  EpochState epoch(true);
  ASSERT_TRUE(epoch.Break("local rank 1 restarted", 10));
  EXPECT_FALSE(epoch.Break("node asks to be admitted", 20));
  EXPECT_EQ(epoch.reason(), "local rank 1 restarted");
  EXPECT_EQ(epoch.broke_ns(), 10);
  ASSERT_TRUE(epoch.Drained(0));
  // Re-forming: a further break is absorbed too.
  EXPECT_FALSE(epoch.Break("bucket 3: timeout", 30));
  EXPECT_EQ(epoch.stage(), Stage::kReforming);
  EXPECT_EQ(epoch.reason(), "local rank 1 restarted");
}

TEST(EpochStateTest, DrainedOnlyWhileDraining) {
  EpochState epoch(true);
  EXPECT_FALSE(epoch.Drained(0));
  EXPECT_EQ(epoch.stage(), Stage::kRunning);
  ASSERT_TRUE(epoch.Break("x", 1));
  ASSERT_TRUE(epoch.Drained(0));
  EXPECT_FALSE(epoch.Drained(0));  // re-forming already
  EXPECT_EQ(epoch.stage(), Stage::kReforming);
}

TEST(EpochStateTest, ResumeOnlyFromReforming) {
  EpochState epoch(true);
  ASSERT_TRUE(epoch.Break("x", 1));
  epoch.Resume();  // still draining: the result cannot have been applied
  EXPECT_EQ(epoch.stage(), Stage::kDraining);
}

TEST(EpochStateTest, DisabledNeverBreaks) {
  EpochState epoch(/*enabled=*/false);
  EXPECT_FALSE(epoch.enabled());
  EXPECT_FALSE(epoch.Break("connection reset", 1));
  EXPECT_EQ(epoch.stage(), Stage::kRunning);
  EXPECT_TRUE(epoch.reason().empty());
}

TEST(EpochStateTest, SecondCycleTakesNewReasonAndTime) {
  EpochState epoch(true);
  ASSERT_TRUE(epoch.Break("first", 100));
  ASSERT_TRUE(epoch.Drained(0));
  epoch.Resume();
  ASSERT_TRUE(epoch.Break("second", 2'000'000'100));
  EXPECT_EQ(epoch.reason(), "second");
  EXPECT_EQ(epoch.ElapsedMs(3'000'000'100), 1000);
}

TEST(EpochStateTest, UnsurvivableNamesWhatIsInPlay) {
  EXPECT_EQ(EpochState::Unsurvivable(false, false), "");
  EXPECT_EQ(EpochState::Unsurvivable(true, false),
            "a join (uneven inputs) is in play");
  EXPECT_EQ(EpochState::Unsurvivable(false, true),
            "a bucket rebuild is pending");
  // A join wins (it is what the error names first).
  EXPECT_EQ(EpochState::Unsurvivable(true, true),
            "a join (uneven inputs) is in play");
}

TEST(EpochStateTest, LostAfterKnownCauseIsTheClosersList) {
  EpochState::Membership m;
  m.cause_known = true;
  m.departed = {"c"};
  m.lost = {"d"};      // ignored: the closer's list is the truth
  m.admitted = {"c"};  // likewise
  EXPECT_THAT(EpochState::LostAfter({"a", "b"}, m), ElementsAre("c"));
}

TEST(EpochStateTest, LostAfterUnknownCauseMergesLostAndAdmitted) {
  EpochState::Membership m;
  m.lost = {"b", "c"};
  // "b" was lost before: listed once.
  EXPECT_THAT(EpochState::LostAfter({"b"}, m), ElementsAre("b", "c"));
  EpochState::Membership back;
  back.admitted = {"b"};
  EXPECT_THAT(EpochState::LostAfter({"b", "c"}, back), ElementsAre("c"));
  EXPECT_THAT(EpochState::LostAfter({}, EpochState::Membership()), IsEmpty());
}

TEST(EpochStateTest, MembershipChangedIgnoresOrder) {
  EXPECT_FALSE(EpochState::MembershipChanged({"b", "a"}, {"a", "b"}, 8, 8));
  EXPECT_TRUE(EpochState::MembershipChanged({"a"}, {"a", "b"}, 4, 8));
  EXPECT_TRUE(EpochState::MembershipChanged({"a", "c"}, {"a", "b"}, 8, 8));
  // Same nodes, another world size (a node came back with fewer ranks).
  EXPECT_TRUE(EpochState::MembershipChanged({"a", "b"}, {"a", "b"}, 6, 8));
}

TEST(EpochStateTest, BucketDivisorRule) {
  EXPECT_EQ(EpochState::BucketDivisor(false, 6), 0);
  EXPECT_EQ(EpochState::BucketDivisor(true, 0), 0);  // formed afresh
  EXPECT_EQ(EpochState::BucketDivisor(true, 6), 6);
}

TEST(EpochStateTest, WorldAfterReFormation) {
  // A node admitted into its running job divides by the initial world
  // size from the start; the membership counts as unchanged until a
  // re-formation says otherwise.
  EpochState admitted(true, EpochState::BucketDivisor(true, 6));
  EXPECT_EQ(admitted.bucket_divisor(), 6);
  EXPECT_FALSE(admitted.membership_changed());

  EpochState epoch(true);
  EXPECT_EQ(epoch.bucket_divisor(), 0);
  ASSERT_TRUE(epoch.Break("node 'b' lost", 1));
  ASSERT_TRUE(epoch.Drained(0));
  epoch.SetWorld(EpochState::MembershipChanged({"a"}, {"a", "b"}, 2, 4),
                 EpochState::BucketDivisor(true, 4));
  epoch.Resume();
  EXPECT_TRUE(epoch.membership_changed());
  EXPECT_EQ(epoch.bucket_divisor(), 4);
  // Back to the nodes it formed with.
  ASSERT_TRUE(epoch.Break("node 'b' admitted", 2));
  ASSERT_TRUE(epoch.Drained(0));
  epoch.SetWorld(EpochState::MembershipChanged({"b", "a"}, {"a", "b"}, 4, 4),
                 EpochState::BucketDivisor(true, 4));
  epoch.Resume();
  EXPECT_FALSE(epoch.membership_changed());
}

}  // namespace
}  // namespace gradd
