#include "server/engine/observe/timeline.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

BucketEvent Bucket(uint64_t iteration, int bucket, const int64_t* ready,
                   size_t ranks) {
  BucketEvent e;
  e.iteration = iteration;
  e.bucket = bucket;
  e.num_buckets = 2;
  e.start_ns = 1000;
  e.phases.local_reduce = {1000, 100};
  e.phases.network = {1100, 300};
  e.phases.write_back = {1400, 50};
  e.done_ns = 1500;
  e.rank_ready_ns = absl::MakeConstSpan(ready, ranks);
  return e;
}

std::vector<std::string> Phases(const std::vector<TimelineEvent>& events) {
  std::vector<std::string> out;
  for (const TimelineEvent& e : events) {
    out.push_back(e.phase + "@" + std::to_string(e.local_rank));
  }
  return out;
}

TEST(TimelineTest, KeepsEachRanksReadyAndTheNodesPhases) {
  Timeline timeline(100);
  const int64_t ready[] = {600, 0, 900};  // rank 1: not seen (unknown)
  timeline.OnBucket(Bucket(7, 1, ready, 3));
  const std::vector<TimelineEvent> events = timeline.Snapshot();
  EXPECT_THAT(Phases(events),
              ElementsAre("ready@0", "ready@2", "local_reduce@-1", "network@-1",
                          "write_back@-1", "done@-1"));
  for (const TimelineEvent& e : events) {
    EXPECT_EQ(e.iteration, 7u);
    EXPECT_EQ(e.bucket, 1);
  }
  // Ready lasts until the bucket started; times are Unix times.
  EXPECT_EQ(events[0].duration_ns, 400);
  EXPECT_EQ(events[1].duration_ns, 100);
  EXPECT_EQ(events[3].duration_ns, 300);
  EXPECT_EQ(events[3].start_unix_ns - events[2].start_unix_ns, 100);
  EXPECT_EQ(events[5].duration_ns, 0);
  EXPECT_EQ(events[0].start_unix_ns, EngineToUnixNs(600));
}

TEST(TimelineTest, SkipsPhasesThatDidNotRun) {
  Timeline timeline(100);
  BucketEvent e = Bucket(1, 0, nullptr, 0);
  e.phases.network = {};
  e.phases.write_back = {};
  timeline.OnBucket(e);
  EXPECT_THAT(Phases(timeline.Snapshot()),
              ElementsAre("local_reduce@-1", "done@-1"));
}

TEST(TimelineTest, RingIsBoundedAndKeepsTheNewestInOrder) {
  Timeline timeline(10);
  EXPECT_EQ(timeline.capacity(), 10u);
  for (uint64_t it = 1; it <= 5; ++it) {
    timeline.OnBucket(Bucket(it, 0, nullptr, 0));  // 4 events each
  }
  const std::vector<TimelineEvent> events = timeline.Snapshot();
  ASSERT_EQ(events.size(), 10u);
  // 20 written, the last 10 kept: the end of iteration 3, then 4 and 5.
  EXPECT_EQ(events.front().iteration, 3u);
  EXPECT_EQ(events.front().phase, "write_back");
  EXPECT_EQ(events.back().iteration, 5u);
  EXPECT_EQ(events.back().phase, "done");
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_LE(events[i - 1].iteration, events[i].iteration);
  }
}

TEST(TimelineTest, ZeroCapacityStillHoldsOne) {
  Timeline timeline(0);
  timeline.OnBucket(Bucket(1, 0, nullptr, 0));
  EXPECT_EQ(timeline.Snapshot().size(), 1u);
}

TEST(TimelineTest, ReformationsAreNodeEventsWithoutABucket) {
  Timeline timeline(100);
  NetworkReformEvent broke;
  broke.epoch = 2;
  broke.broke_ns = 5000;
  broke.at_ns = 5000;
  timeline.OnNetworkBroken(broke);
  NetworkReformEvent reformed;
  reformed.epoch = 3;
  reformed.broke_ns = 5000;
  reformed.at_ns = 8000;
  reformed.aborted_iteration = 41;
  timeline.OnNetworkReformed(reformed);
  const std::vector<TimelineEvent> events = timeline.Snapshot();
  EXPECT_THAT(Phases(events),
              ElementsAre("network_broken@-1", "network_reformed@-1",
                          "iteration_aborted@-1"));
  for (const TimelineEvent& e : events) EXPECT_EQ(e.bucket, -1);
  EXPECT_EQ(events[0].iteration, 2u);  // the epoch left
  EXPECT_EQ(events[0].duration_ns, 0);
  EXPECT_EQ(events[1].iteration, 3u);      // the new epoch
  EXPECT_EQ(events[1].duration_ns, 3000);  // from the break
  EXPECT_EQ(events[1].start_unix_ns, events[0].start_unix_ns);
  EXPECT_EQ(events[2].iteration, 41u);
  EXPECT_EQ(events[2].start_unix_ns - events[1].start_unix_ns, 3000);
}

}  // namespace
}  // namespace gradd
