#include "server/engine/observe/iteration_tracker.h"

#include "gtest/gtest.h"

namespace gradd {
namespace {

BucketEvent Bucket(uint64_t iteration, int bucket, int num_buckets,
                   int64_t start, int64_t done) {
  BucketEvent e;
  e.iteration = iteration;
  e.bucket = bucket;
  e.num_buckets = num_buckets;
  e.start_ns = start;
  e.done_ns = done;
  return e;
}

TEST(IterationTrackerTest, UnionOfSpansAndTheOverlapWithBackward) {
  IterationTracker tracker(4);
  // Buckets handed over at 100, 150 and 400 (the last: backward ends);
  // busy [100, 200) u [150, 250) = [100, 250), then [400, 450).
  EXPECT_FALSE(tracker.Add(Bucket(1, 0, 3, 100, 200)).has_value());
  EXPECT_FALSE(tracker.Add(Bucket(1, 1, 3, 150, 250)).has_value());
  std::optional<IterationEvent> e = tracker.Add(Bucket(1, 2, 3, 400, 450));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->iteration, 1u);
  EXPECT_EQ(e->communication_ns, 200);
  EXPECT_EQ(e->overlapped_ns, 150);
  EXPECT_EQ(e->step_ns, 0);  // the first iteration seen

  // The next iteration: step from its end (450) to this end (1450).
  EXPECT_FALSE(tracker.Add(Bucket(2, 1, 3, 1000, 1100)).has_value());
  EXPECT_FALSE(tracker.Add(Bucket(2, 0, 3, 1200, 1300)).has_value());
  e = tracker.Add(Bucket(2, 2, 3, 1300, 1450));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->step_ns, 1000);
  EXPECT_EQ(e->communication_ns, 100 + 250);
  EXPECT_EQ(e->overlapped_ns, 100 + 100);
}

TEST(IterationTrackerTest, AnIncompleteIterationIsDropped) {
  IterationTracker tracker(2);
  EXPECT_FALSE(tracker.Add(Bucket(1, 0, 2, 0, 10)).has_value());
  // Iteration 1 never completes (e.g. a join round took over).
  EXPECT_FALSE(tracker.Add(Bucket(2, 0, 2, 100, 110)).has_value());
  std::optional<IterationEvent> e = tracker.Add(Bucket(2, 1, 2, 120, 130));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->iteration, 2u);
  EXPECT_EQ(e->step_ns, 0);  // no complete iteration 1 to measure from
  EXPECT_EQ(e->communication_ns, 20);
}

TEST(IterationTrackerTest, OneBucketJobsOverlapNothing) {
  IterationTracker tracker(1);
  std::optional<IterationEvent> e = tracker.Add(Bucket(1, 0, 1, 10, 30));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->communication_ns, 20);
  EXPECT_EQ(e->overlapped_ns, 0);
}

}  // namespace
}  // namespace gradd
