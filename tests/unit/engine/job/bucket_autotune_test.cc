#include "server/engine/job/bucket_autotune.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace gradd {
namespace {

constexpr size_t kMiB = 1 << 20;

AutotuneOptions Options() {
  AutotuneOptions o;
  o.caps = {1 * kMiB, 4 * kMiB, 10 * kMiB};
  o.warmup_iterations = 1;
  o.measured_iterations = 3;
  o.fallback_cap_bytes = 25 * kMiB;
  return o;
}

// Feeds iterations (after, after + n] with the step time `ns(iteration)`.
template <typename F>
void Steps(BucketAutotune& t, uint64_t after, int n, F ns) {
  for (uint64_t it = after + 1; it <= after + n; ++it) t.OnStep(it, ns(it));
}

TEST(BucketAutotuneTest, TriesEveryCapThenSettlesOnTheFastest) {
  BucketAutotune t(Options());
  EXPECT_EQ(t.state(), BucketAutotune::State::kWaiting);
  // Rebuild after iteration 1: trial 1 (1 MiB), iterations 2 (warm-up),
  // 3-5 measured, next switch after 5.
  BucketAutotune::Setting s = t.Start(1, Options().caps);
  EXPECT_EQ(t.state(), BucketAutotune::State::kTuning);
  EXPECT_EQ(s.cap_bytes, 1 * kMiB);
  EXPECT_EQ(s.next_switch_after, 5u);
  EXPECT_EQ(s.trial, 1);
  EXPECT_EQ(s.trials, 3);
  // The warm-up is slow (the gradients moved): not counted.
  Steps(t, 1, 4, [](uint64_t it) { return it == 2 ? 900 : 300; });
  s = t.Next(5);
  EXPECT_EQ(s.cap_bytes, 4 * kMiB);
  EXPECT_EQ(s.next_switch_after, 9u);
  EXPECT_EQ(s.trial, 2);
  Steps(t, 5, 4, [](uint64_t) { return 200; });
  s = t.Next(9);
  EXPECT_EQ(s.cap_bytes, 10 * kMiB);
  EXPECT_EQ(s.next_switch_after, 13u);
  Steps(t, 9, 4, [](uint64_t) { return 250; });
  s = t.Next(13);
  EXPECT_EQ(t.state(), BucketAutotune::State::kSettled);
  EXPECT_EQ(s.cap_bytes, 4 * kMiB);
  EXPECT_EQ(s.next_switch_after, 0u);
  EXPECT_EQ(t.settled_after(), 13u);
  ASSERT_EQ(t.trials_done().size(), 3u);
  EXPECT_EQ(t.trials_done()[0].step_ns, 300);
  EXPECT_EQ(t.trials_done()[0].iterations, 3);
  EXPECT_EQ(t.trials_done()[1].step_ns, 200);
  EXPECT_EQ(t.trials_done()[2].step_ns, 250);
}

TEST(BucketAutotuneTest, SettledIsFinal) {
  BucketAutotune t(Options());
  t.Start(1, {1 * kMiB, 4 * kMiB});
  Steps(t, 1, 4, [](uint64_t) { return 100; });
  t.Next(5);
  Steps(t, 5, 4, [](uint64_t) { return 200; });
  BucketAutotune::Setting s = t.Next(9);
  EXPECT_EQ(s.cap_bytes, 1 * kMiB);
  // Later times, calls and starts change nothing.
  Steps(t, 9, 10, [](uint64_t) { return 1; });
  s = t.Next(20);
  EXPECT_EQ(s.cap_bytes, 1 * kMiB);
  EXPECT_EQ(s.next_switch_after, 0u);
  s = t.Start(30, {64 * kMiB, 25 * kMiB});
  EXPECT_EQ(s.cap_bytes, 1 * kMiB);
  EXPECT_EQ(t.state(), BucketAutotune::State::kSettled);
  EXPECT_EQ(t.trials_done().size(), 2u);
}

TEST(BucketAutotuneTest, MedianResistsOneOutlier) {
  BucketAutotune t(Options());
  t.Start(1, {1 * kMiB, 4 * kMiB});
  // 1 MiB: 100, 100, 5000 (a hiccup) -> median 100.
  Steps(t, 1, 4, [](uint64_t it) { return it == 5 ? 5000 : 100; });
  t.Next(5);
  Steps(t, 5, 4, [](uint64_t) { return 150; });
  EXPECT_EQ(t.Next(9).cap_bytes, 1 * kMiB);
}

TEST(BucketAutotuneTest, IgnoresTimesOutsideTheMeasuredWindow) {
  BucketAutotune t(Options());
  t.Start(1, {1 * kMiB, 4 * kMiB});
  t.OnStep(1, 1);  // before the switch
  t.OnStep(2, 1);  // the warm-up
  t.OnStep(3, 0);  // no time (the first iteration the tracker saw)
  t.OnStep(4, 500);
  t.OnStep(6, 1);  // after the trial's last iteration
  t.Next(5);
  ASSERT_EQ(t.trials_done().size(), 1u);
  EXPECT_EQ(t.trials_done()[0].step_ns, 500);
  EXPECT_EQ(t.trials_done()[0].iterations, 1);
}

TEST(BucketAutotuneTest, TrialsWithoutTimesLoseAndNoneFallsBack) {
  BucketAutotune t(Options());
  t.Start(1, {1 * kMiB, 4 * kMiB});
  t.Next(5);  // nothing measured for 1 MiB
  Steps(t, 5, 4, [](uint64_t) { return 900; });
  EXPECT_EQ(t.Next(9).cap_bytes, 4 * kMiB);

  BucketAutotune none(Options());
  none.Start(1, {1 * kMiB, 4 * kMiB});
  none.Next(5);
  EXPECT_EQ(none.Next(9).cap_bytes, 25 * kMiB);
  EXPECT_EQ(none.state(), BucketAutotune::State::kSettled);
  EXPECT_FALSE(none.note().empty());
}

TEST(BucketAutotuneTest, OneDistinctPlanSettlesAtOnce) {
  BucketAutotune t(Options());
  BucketAutotune::Setting s = t.Start(1, {4 * kMiB});
  EXPECT_EQ(t.state(), BucketAutotune::State::kSettled);
  EXPECT_EQ(s.cap_bytes, 4 * kMiB);
  EXPECT_EQ(s.next_switch_after, 0u);
  EXPECT_EQ(t.settled_after(), 1u);
}

TEST(BucketAutotuneTest, EqualTimesKeepTheEarlierCap) {
  BucketAutotune t(Options());
  t.Start(1, {1 * kMiB, 4 * kMiB});
  Steps(t, 1, 4, [](uint64_t) { return 100; });
  t.Next(5);
  Steps(t, 5, 4, [](uint64_t) { return 100; });
  EXPECT_EQ(t.Next(9).cap_bytes, 1 * kMiB);
}

TEST(BucketAutotuneTest, BoundedTrialsAndIterations) {
  AutotuneOptions o = DefaultAutotuneOptions();
  BucketAutotune t(o);
  BucketAutotune::Setting s = t.Start(1, o.caps);
  int switches = 1;
  uint64_t last = 1;
  while (s.next_switch_after != 0) {
    ASSERT_LE(switches, static_cast<int>(o.caps.size()) + 1);
    last = s.next_switch_after;
    s = t.Next(last);
    ++switches;
  }
  EXPECT_EQ(switches, static_cast<int>(o.caps.size()) + 1);
  EXPECT_EQ(last - 1,
            o.caps.size() * static_cast<uint64_t>(o.warmup_iterations +
                                                  o.measured_iterations));
}

TEST(BucketAutotuneTest, StopAndFollow) {
  BucketAutotune t(Options());
  t.Start(1, {1 * kMiB, 4 * kMiB});
  t.Stop("a rank skipped the switch");
  EXPECT_EQ(t.state(), BucketAutotune::State::kOff);
  EXPECT_EQ(t.setting().next_switch_after, 0u);
  EXPECT_EQ(t.note(), "a rank skipped the switch");

  // Another node follows node rank 0's settings.
  BucketAutotune f(Options());
  f.Follow(1, {1 * kMiB, 5, 1, 2});
  EXPECT_EQ(f.state(), BucketAutotune::State::kTuning);
  EXPECT_EQ(f.setting().trial, 1);
  f.Follow(5, {4 * kMiB, 9, 2, 2});
  f.Follow(9, {4 * kMiB, 0, 0, 2});
  EXPECT_EQ(f.state(), BucketAutotune::State::kSettled);
  EXPECT_EQ(f.setting().cap_bytes, 4 * kMiB);
  EXPECT_EQ(f.settled_after(), 9u);
  EXPECT_EQ(f.trials_done().size(), 2u);
}

TEST(BucketAutotuneTest, PartitionsAreTriedWithTheBestCap) {
  AutotuneOptions o = Options();
  o.partitions = {0, 1 * kMiB, 4 * kMiB};
  BucketAutotune t(o);
  BucketAutotune::Setting s = t.Start(1, {1 * kMiB, 4 * kMiB});
  EXPECT_EQ(s.trials, 5);
  EXPECT_FALSE(s.partition_bytes.has_value());
  Steps(t, 1, 4, [](uint64_t) { return 300; });
  s = t.Next(5);
  Steps(t, 5, 4, [](uint64_t) { return 200; });  // 4 MiB is the best cap
  s = t.Next(9);
  EXPECT_EQ(s.trial, 3);
  EXPECT_EQ(s.cap_bytes, 4 * kMiB);
  ASSERT_TRUE(s.partition_bytes.has_value());
  EXPECT_EQ(*s.partition_bytes, 0u);
  Steps(t, 9, 4, [](uint64_t) { return 210; });
  s = t.Next(13);
  EXPECT_EQ(s.cap_bytes, 4 * kMiB);
  EXPECT_EQ(*s.partition_bytes, 1 * kMiB);
  Steps(t, 13, 4, [](uint64_t) { return 150; });
  s = t.Next(17);
  EXPECT_EQ(*s.partition_bytes, 4 * kMiB);
  Steps(t, 17, 4, [](uint64_t) { return 180; });
  s = t.Next(21);
  EXPECT_EQ(t.state(), BucketAutotune::State::kSettled);
  EXPECT_EQ(s.next_switch_after, 0u);
  EXPECT_EQ(s.cap_bytes, 4 * kMiB);
  ASSERT_TRUE(s.partition_bytes.has_value());
  EXPECT_EQ(*s.partition_bytes, 1 * kMiB);
  ASSERT_EQ(t.trials_done().size(), 5u);
  EXPECT_EQ(*t.trials_done()[3].partition_bytes, 1 * kMiB);
}

TEST(BucketAutotuneTest, OneDistinctCapStillTriesThePartitions) {
  AutotuneOptions o = Options();
  o.partitions = {0, 4 * kMiB};
  BucketAutotune t(o);
  BucketAutotune::Setting s = t.Start(1, {10 * kMiB});
  EXPECT_EQ(t.state(), BucketAutotune::State::kTuning);
  EXPECT_EQ(s.trials, 2);
  EXPECT_EQ(s.cap_bytes, 10 * kMiB);
  EXPECT_EQ(*s.partition_bytes, 0u);
  Steps(t, 1, 4, [](uint64_t) { return 300; });
  s = t.Next(5);
  EXPECT_EQ(*s.partition_bytes, 4 * kMiB);
  Steps(t, 5, 4, [](uint64_t) { return 400; });
  s = t.Next(9);
  EXPECT_EQ(s.cap_bytes, 10 * kMiB);
  EXPECT_EQ(*s.partition_bytes, 0u);
}

TEST(AutotuneRecordTest, SnapshotCopiesTheState) {
  AutotuneRecord r(Options());
  r.Start(1, {1 * kMiB, 4 * kMiB});
  r.OnStep(3, 10);
  AutotuneSnapshot s = r.Snapshot();
  EXPECT_EQ(s.state, BucketAutotune::State::kTuning);
  EXPECT_EQ(s.setting.trial, 1);
  EXPECT_TRUE(s.decided_here);
  r.Follow(5, {4 * kMiB, 0, 0, 2});
  EXPECT_FALSE(r.Snapshot().decided_here);
  EXPECT_STREQ(AutotuneStateName(r.state()), "settled");
}

}  // namespace
}  // namespace gradd
