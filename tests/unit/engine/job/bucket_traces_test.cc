// BucketTraces driven by hand: the test plays the engine's scan (ranks
// seen handing buckets over, buckets started) with a fake clock, and the
// completions (Emit) with a sink that records the events.
#include "server/engine/job/bucket_traces.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;

class RecordingSink final : public JobEventSinkInterface {
 public:
  void OnBucket(const BucketEvent& e) override {
    buckets.push_back(e);
    ready.emplace_back(e.rank_ready_ns.begin(), e.rank_ready_ns.end());
  }
  void OnIteration(const IterationEvent& e) override {
    iterations.push_back(e);
  }
  std::vector<BucketEvent> buckets;
  std::vector<std::vector<int64_t>> ready;  // copies: the span is cleared
  std::vector<IterationEvent> iterations;
};

BucketPlan Plan(int buckets, uint64_t bytes) {
  BucketPlan plan;
  plan.buckets.resize(buckets);
  for (Bucket& b : plan.buckets) b.size_bytes = bytes;
  return plan;
}

class BucketTracesTest : public ::testing::Test {
 protected:
  BucketTracesTest() { traces_.Reset(Plan(2, 64)); }

  // The scan at clock `t`: rank r made bucket b ready for `iteration`.
  void Ready(size_t b, int r, uint64_t iteration, int64_t t) {
    int64_t now = 0;
    traces_.NoteReady(b, r, iteration, &now, [&] {
      ++clock_reads_;
      return t;
    });
  }

  BucketTraces traces_{2, 8};
  RecordingSink sink_;
  int clock_reads_ = 0;
};

TEST_F(BucketTracesTest, FirstReadyAndEachRanksTimeReachTheBucketEvent) {
  Ready(0, 1, 1, 100);
  Ready(0, 1, 1, 150);  // seen again: the first time stays
  Ready(0, 0, 1, 200);
  EXPECT_EQ(traces_.first_ready_iteration(0), 1u);
  EXPECT_EQ(traces_.first_ready_ns(0), 100);
  EXPECT_EQ(traces_.first_ready_iteration(1), 0u);
  BucketTiming* timing = traces_.Started(0, 1, 300);
  ASSERT_NE(timing, nullptr);
  EXPECT_EQ(traces_.started_ns(0), 300);
  timing->network.Add(310, 42);
  traces_.Emit(0, 1, 400, &sink_);
  ASSERT_EQ(sink_.buckets.size(), 1u);
  const BucketEvent& e = sink_.buckets[0];
  EXPECT_EQ(e.iteration, 1u);
  EXPECT_EQ(e.bucket, 0);
  EXPECT_EQ(e.num_buckets, 2);
  EXPECT_EQ(e.bytes, 64u);
  EXPECT_EQ(e.first_ready_ns, 100);
  EXPECT_EQ(e.start_ns, 300);
  EXPECT_EQ(e.done_ns, 400);
  EXPECT_EQ(e.phases.network.duration_ns, 42);
  EXPECT_THAT(sink_.ready[0], ElementsAre(200, 100));
  // The per-rank times are cleared for the next iteration.
  Ready(0, 0, 2, 500);
  traces_.Started(0, 2, 600);
  traces_.Emit(0, 2, 700, &sink_);
  EXPECT_THAT(sink_.ready[1], ElementsAre(500, 0));
}

TEST_F(BucketTracesTest, AScanReadsTheClockAtMostOnce) {
  int64_t now = 0;
  auto clock = [&] {
    ++clock_reads_;
    return int64_t{7};
  };
  traces_.NoteReady(0, 0, 1, &now, clock);
  traces_.NoteReady(0, 1, 1, &now, clock);
  traces_.NoteReady(1, 0, 1, &now, clock);
  EXPECT_EQ(clock_reads_, 1);
  EXPECT_EQ(traces_.first_ready_ns(1), 7);
}

TEST_F(BucketTracesTest, StartedWithoutTheReadyOfItsIterationHasNoFirstReady) {
  Ready(0, 0, 1, 100);
  traces_.Started(0, 2, 300);  // e.g. a join iteration: not noted
  traces_.Emit(0, 2, 400, &sink_);
  ASSERT_EQ(sink_.buckets.size(), 1u);
  EXPECT_EQ(sink_.buckets[0].first_ready_ns, 0);
}

TEST_F(BucketTracesTest, ACompletionOfAnotherIterationEmitsNothing) {
  traces_.Started(0, 1, 300);
  traces_.Emit(0, 2, 400, &sink_);  // not what was started (aborted)
  EXPECT_TRUE(sink_.buckets.empty());
}

TEST_F(BucketTracesTest, TheLastBucketOfAnIterationEmitsTheIteration) {
  for (uint64_t it = 1; it <= 2; ++it) {
    for (int b = 0; b < 2; ++b) {
      traces_.Started(b, it, it * 1000 + b * 10);
      traces_.Emit(b, it, it * 1000 + b * 10 + 5, &sink_);
    }
  }
  EXPECT_EQ(sink_.buckets.size(), 4u);
  ASSERT_EQ(sink_.iterations.size(), 2u);
  EXPECT_EQ(sink_.iterations[1].iteration, 2u);
}

TEST_F(BucketTracesTest, ForgetWaitsEndsEveryWait) {
  Ready(0, 0, 1, 100);
  Ready(1, 1, 1, 100);
  traces_.ForgetWaits();
  EXPECT_EQ(traces_.first_ready_iteration(0), 0u);
  EXPECT_EQ(traces_.first_ready_iteration(1), 0u);
  traces_.Started(1, 1, 300);
  traces_.Emit(1, 1, 400, &sink_);
  EXPECT_THAT(sink_.ready[0], ElementsAre(0, 0));
}

TEST_F(BucketTracesTest, ResetFollowsThePlan) {
  traces_.Reset(Plan(3, 128));
  traces_.Started(2, 1, 300);
  traces_.Emit(2, 1, 400, &sink_);
  ASSERT_EQ(sink_.buckets.size(), 1u);
  EXPECT_EQ(sink_.buckets[0].num_buckets, 3);
  EXPECT_EQ(sink_.buckets[0].bytes, 128u);
}

TEST(BucketTracesLimitTest, TooManyBucketsTimesRanksKeepsNoPerRankTimes) {
  BucketTraces traces(1 << 11, 8);
  traces.Reset(Plan(1 << 10, 4));  // 2^21 > kMaxTrackedReadies
  int64_t now = 0;
  traces.NoteReady(5, 3, 1, &now, [] { return int64_t{9}; });
  EXPECT_EQ(traces.first_ready_ns(5), 9);  // still the first ready
  RecordingSink sink;
  traces.Started(5, 1, 10);
  traces.Emit(5, 1, 11, &sink);
  ASSERT_EQ(sink.buckets.size(), 1u);
  EXPECT_TRUE(sink.buckets[0].rank_ready_ns.empty());
}

}  // namespace
}  // namespace gradd
