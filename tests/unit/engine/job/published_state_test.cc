// PublishedState: what the engine publishes, read back as other threads
// read it.
#include "server/engine/job/published_state.h"

#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace gradd {
namespace {

PublishedState::Layout Initial() {
  PublishedState::Layout l;
  l.node_rank = 1;
  l.num_nodes = 3;
  l.world_size = 6;
  l.node_ids = {"a", "b", "c"};
  return l;
}

TEST(PublishedStateTest, LayoutAndPhase) {
  PublishedState p(Initial());
  EXPECT_EQ(p.world_size(), 6);
  EXPECT_EQ(p.layout().node_ids, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(p.phase(), JobPhase::kRunning);
  PublishedState::Layout moved = p.layout();
  moved.node_rank = 0;
  moved.num_nodes = 2;
  moved.world_size = 4;
  moved.node_ids = {"b", "c"};
  moved.lost = {"a"};
  moved.last_reason = "node 'a' lost";
  p.SetLayout(moved);
  p.SetPhase(JobPhase::kReforming);
  EXPECT_EQ(p.world_size(), 4);
  EXPECT_EQ(p.layout().lost, std::vector<std::string>{"a"});
  EXPECT_EQ(p.layout().last_reason, "node 'a' lost");
  EXPECT_EQ(p.phase(), JobPhase::kReforming);
}

TEST(PublishedStateTest, Plan) {
  PublishedState p(Initial());
  EXPECT_EQ(p.plan(), nullptr);
  auto plan = std::make_shared<BucketPlan>();
  plan->buckets.resize(2);
  p.PublishPlan(plan);
  ASSERT_NE(p.plan(), nullptr);
  EXPECT_EQ(p.plan()->buckets.size(), 2u);
}

TEST(PublishedStateTest, UsedMapKeepsTheLatestIteration) {
  PublishedState p(Initial());
  EXPECT_EQ(p.used_map(true).iteration, 0u);
  p.RecordUnused(5, {2, 3});
  p.RecordUnused(4, {9});  // a completion out of order: dropped
  PublishedState::UsedMap m = p.used_map(true);
  EXPECT_EQ(m.iteration, 5u);
  EXPECT_TRUE(m.ever_unused);
  EXPECT_EQ(m.unused, (std::vector<int32_t>{2, 3}));
  EXPECT_TRUE(p.used_map(false).unused.empty());  // only with the params
  p.RecordUnused(6, {});
  m = p.used_map(true);
  EXPECT_EQ(m.iteration, 6u);
  EXPECT_TRUE(m.ever_unused);  // some iteration had some
  EXPECT_TRUE(m.unused.empty());
}

TEST(PublishedStateTest, ReadersOnOtherThreads) {
  PublishedState p(Initial());
  std::thread completion([&] {
    for (uint64_t i = 1; i <= 100; ++i) p.RecordUnused(i, {1});
  });
  std::thread admin([&] {
    uint64_t last = 0;
    for (int i = 0; i < 100; ++i) {
      const uint64_t now = p.used_map(true).iteration;
      EXPECT_GE(now, last);
      last = now;
      EXPECT_GE(p.world_size(), 4);
    }
  });
  for (int i = 0; i < 100; ++i) {
    PublishedState::Layout l = p.layout();
    l.world_size = 4 + i % 3;
    p.SetLayout(l);
  }
  completion.join();
  admin.join();
  EXPECT_EQ(p.used_map(false).iteration, 100u);
}

}  // namespace
}  // namespace gradd
