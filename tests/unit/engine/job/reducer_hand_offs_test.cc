// ReducerSlot, ReducerHandOvers and JoinRoundResult driven by hand: the
// test plays the engine thread and the reducer's completion threads.
#include "server/engine/job/reducer_hand_offs.h"

#include <atomic>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/engine/job/counted_reducer.h"

namespace gradd {
namespace {

TEST(ReducerSlotTest, KeepsTheRetiredTotals) {
  std::atomic<int> destroyed{0};
  ReducerSlot slot(std::make_unique<CountedReducer>(&destroyed, 3));
  ASSERT_NE(slot.get(), nullptr);
  EXPECT_EQ(slot.stats().buckets, 3u);
  // A re-formation: the old reducer goes (destroyed), its totals stay.
  slot.Replace(nullptr);
  EXPECT_EQ(destroyed.load(), 1);
  EXPECT_EQ(slot.get(), nullptr);
  EXPECT_EQ(slot.stats().buckets, 3u);
  v1::AttachResponse r;
  slot.DescribeDevice(0, &r);  // nothing while re-forming
  EXPECT_EQ(r.global_rank(), 0);
  slot.Replace(std::make_unique<CountedReducer>(&destroyed, 5));
  EXPECT_EQ(slot.stats().buckets, 8u);
  EXPECT_EQ(slot.stats().network_ns, 80u);
  slot->Start(BucketWork(), [](absl::Status) {});
  slot.DescribeDevice(2, &r);
  EXPECT_EQ(r.global_rank(), 102);
}

TEST(ReducerSlotTest, OtherThreadsReadWhileTheEngineReplaces) {
  std::atomic<int> destroyed{0};
  ReducerSlot slot(std::make_unique<CountedReducer>(&destroyed, 1));
  std::atomic<bool> done{false};
  std::thread admin([&] {
    uint64_t last = 0;
    while (!done.load()) {
      const uint64_t now = slot.stats().buckets;
      EXPECT_GE(now, last);  // totals never go back
      last = now;
    }
  });
  for (int i = 0; i < 100; ++i) {
    slot.Replace(std::make_unique<CountedReducer>(&destroyed, 1));
  }
  done.store(true);
  admin.join();
  EXPECT_EQ(slot.stats().buckets, 101u);
  EXPECT_EQ(destroyed.load(), 100);
}

TEST(ReducerHandOversTest, CountsAndRingsOnlyTheLastWhileDraining) {
  ReducerHandOvers h;
  h.Started();
  h.Started();
  EXPECT_EQ(h.count(), 2);
  EXPECT_FALSE(h.Done());  // not draining: no ring
  h.Started();
  h.SetDraining(true);
  EXPECT_FALSE(h.Done());  // one more still with the reducer
  EXPECT_TRUE(h.Done());   // the last one: ring the engine
  EXPECT_EQ(h.count(), 0);
  h.SetDraining(false);
  h.Started();
  EXPECT_FALSE(h.Done());
}

TEST(ReducerHandOversTest, CompletionsOnOtherThreads) {
  ReducerHandOvers h;
  constexpr int kWork = 1000;
  for (int i = 0; i < kWork; ++i) h.Started();
  h.SetDraining(true);
  std::atomic<int> rings{0};
  std::vector<std::thread> completions;
  for (int t = 0; t < 4; ++t) {
    completions.emplace_back([&] {
      for (int i = 0; i < kWork / 4; ++i) rings += h.Done();
    });
  }
  for (std::thread& t : completions) t.join();
  EXPECT_EQ(h.count(), 0);
  EXPECT_EQ(rings.load(), 1);
}

TEST(JoinRoundResultTest, PostedByTheCompletionTakenOnce) {
  JoinRoundResult round;
  EXPECT_FALSE(round.Take().has_value());
  std::thread completion([&] {
    round.Post(absl::OkStatus(), std::vector<double>{1, 2, 3});
  });
  completion.join();
  std::optional<JoinRoundResult::Result> r = round.Take();
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->status.ok());
  EXPECT_EQ(r->values, (std::vector<double>{1, 2, 3}));
  EXPECT_FALSE(round.Take().has_value());
  round.Post(absl::UnavailableError("peer gone"), {});
  r = round.Take();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status.code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace gradd
