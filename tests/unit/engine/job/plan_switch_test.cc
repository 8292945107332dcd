// PlanSwitch driven by hand: started and done sequences in, the boundary
// verdict out (no Job, no control block, no threads).
#include "server/engine/job/plan_switch.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace gradd {
namespace {

using Boundary = PlanSwitch::Boundary;

PlanSwitch::Check At(const PlanSwitch& s, const std::vector<uint64_t>& started,
                     const std::vector<uint64_t>& done) {
  return s.AtBoundary(
      done.size(), [&](size_t b) { return started[b]; },
      [&](size_t b) { return done[b]; });
}

TEST(PlanSwitchTest, BeginAndEnd) {
  PlanSwitch s;
  EXPECT_FALSE(s.switching());
  ASSERT_TRUE(s.Begin(10));
  EXPECT_TRUE(s.switching());
  EXPECT_EQ(s.iteration(), 10u);
  // One switch at a time: a second Begin changes nothing.
  EXPECT_FALSE(s.Begin(11));
  EXPECT_EQ(s.iteration(), 10u);
  s.End();
  EXPECT_FALSE(s.switching());
  ASSERT_TRUE(s.Begin(20));
  EXPECT_EQ(s.iteration(), 20u);
}

TEST(PlanSwitchTest, WaitsForIterationInFlightThenReaches) {
  PlanSwitch s;
  ASSERT_TRUE(s.Begin(10));
  // Bucket 1 of iteration 10 is with the reducer.
  EXPECT_EQ(At(s, {10, 10}, {10, 9}).boundary, Boundary::kNotYet);
  // Not started yet at all.
  EXPECT_EQ(At(s, {10, 9}, {10, 9}).boundary, Boundary::kNotYet);
  // Every bucket done with exactly 10.
  EXPECT_EQ(At(s, {10, 10}, {10, 10}).boundary, Boundary::kReached);
}

TEST(PlanSwitchTest, PassedNamesTheFirstBucketPastTheBoundary) {
  PlanSwitch s;
  ASSERT_TRUE(s.Begin(10));
  const PlanSwitch::Check c = At(s, {10, 11, 11}, {10, 11, 11});
  EXPECT_EQ(c.boundary, Boundary::kPassed);
  EXPECT_EQ(c.bucket, 1u);
  EXPECT_EQ(c.done, 11u);
}

TEST(PlanSwitchTest, AnEarlierBucketStillInFlightWinsOverALaterOnePast) {
  // The check goes in bucket order: bucket 0 still running iteration 10
  // means "not yet", whatever bucket 1 says.
  PlanSwitch s;
  ASSERT_TRUE(s.Begin(10));
  EXPECT_EQ(At(s, {10, 11}, {9, 11}).boundary, Boundary::kNotYet);
}

TEST(PlanSwitchTest, EmptyPlanIsAtItsBoundary) {
  PlanSwitch s;
  ASSERT_TRUE(s.Begin(3));
  EXPECT_EQ(At(s, {}, {}).boundary, Boundary::kReached);
}

TEST(PlanSwitchTest, SkipsRebuild) {
  EXPECT_FALSE(PlanSwitch::SkipsRebuild(0, 100));  // none expected
  EXPECT_FALSE(PlanSwitch::SkipsRebuild(10, 10));
  EXPECT_TRUE(PlanSwitch::SkipsRebuild(10, 11));
}

TEST(PlanSwitchTest, Fits) {
  BucketPlan plan;
  plan.buckets.resize(3);
  plan.total_bytes = 4096;
  plan.device_bytes = 0;
  EXPECT_TRUE(PlanSwitch::Fits(plan, {3, 4096, 0}));
  EXPECT_FALSE(PlanSwitch::Fits(plan, {2, 4096, 0}));  // slots
  EXPECT_FALSE(PlanSwitch::Fits(plan, {3, 4095, 0}));  // bucket region
  plan.device_bytes = 512;
  EXPECT_FALSE(PlanSwitch::Fits(plan, {3, 4096, 256}));  // device region
  EXPECT_TRUE(PlanSwitch::Fits(plan, {3, 4096, 512}));
}

TEST(PlanSwitchTest, SameBuckets) {
  BucketPlan a;
  a.buckets.resize(2);
  a.buckets[0].params = {0, 1};
  a.buckets[1].params = {2};
  BucketPlan b = a;
  b.buckets[1].size_bytes = 64;  // only the parameters count
  EXPECT_TRUE(PlanSwitch::SameBuckets(a, b));
  b.buckets[1].params = {3};
  EXPECT_FALSE(PlanSwitch::SameBuckets(a, b));
  b = a;
  b.buckets.pop_back();
  EXPECT_FALSE(PlanSwitch::SameBuckets(a, b));
}

}  // namespace
}  // namespace gradd
