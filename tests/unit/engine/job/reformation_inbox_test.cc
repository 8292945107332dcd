// ReformationInbox driven by hand: other threads post errors, requests and
// results; the test plays the engine thread and takes them.
#include "server/engine/job/reformation_inbox.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/engine/job/counted_reducer.h"

namespace gradd {
namespace {

class ReformationInboxTest : public ::testing::Test {
 protected:
  ReformationResult Result(uint64_t epoch) {
    ReformationResult r;
    r.reducer = std::make_unique<CountedReducer>(&destroyed_);
    r.epoch = epoch;
    return r;
  }

  std::atomic<int> wakes_{0};
  std::atomic<int> destroyed_{0};
  ReformationInbox inbox_{[this] { wakes_.fetch_add(1); }};
};

TEST_F(ReformationInboxTest, NothingThereCostsOneLoad) {
  EXPECT_FALSE(inbox_.pending());
  ReformationInbox::Taken t = inbox_.Take();
  EXPECT_FALSE(t.error.has_value());
  EXPECT_FALSE(t.request.has_value());
  EXPECT_FALSE(t.result.has_value());
  EXPECT_EQ(wakes_.load(), 0);
}

TEST_F(ReformationInboxTest, PostsFromOtherThreadsWakeTheEngine) {
  std::thread completion([&] { inbox_.PostError("bucket 3: reset"); });
  std::thread watcher([&] { inbox_.PostRequest("node 'c' asks in"); });
  completion.join();
  watcher.join();
  EXPECT_EQ(wakes_.load(), 2);
  ASSERT_TRUE(inbox_.pending());
  ReformationInbox::Taken t = inbox_.Take();
  EXPECT_FALSE(inbox_.pending());
  ASSERT_TRUE(t.error.has_value());
  EXPECT_EQ(*t.error, "bucket 3: reset");
  ASSERT_TRUE(t.request.has_value());
  EXPECT_EQ(*t.request, "node 'c' asks in");
  // Taken once.
  t = inbox_.Take();
  EXPECT_FALSE(t.error.has_value());
  EXPECT_FALSE(t.request.has_value());
}

TEST_F(ReformationInboxTest, FirstErrorAndFirstRequestWinUntilTaken) {
  inbox_.PostError("bucket 3: reset");
  inbox_.PostError("bucket 4: cancelled");  // the drain echoes the first
  inbox_.PostRequest("first");
  inbox_.PostRequest("second");
  ReformationInbox::Taken t = inbox_.Take();
  EXPECT_EQ(*t.error, "bucket 3: reset");
  EXPECT_EQ(*t.request, "first");
  // After a Take the next one is the first again.
  inbox_.PostError("bucket 5: reset");
  EXPECT_EQ(*inbox_.Take().error, "bucket 5: reset");
}

TEST_F(ReformationInboxTest, ALaterResultReplacesOneNotTaken) {
  inbox_.PostResult(Result(1));
  inbox_.PostResult(Result(2));
  EXPECT_EQ(destroyed_.load(), 1);  // the first one's reducer
  ReformationInbox::Taken t = inbox_.Take();
  ASSERT_TRUE(t.result.has_value());
  ASSERT_TRUE(t.result->ok());
  EXPECT_EQ((*t.result)->epoch, 2u);
  inbox_.PostResult(absl::AbortedError("the closer gave up"));
  t = inbox_.Take();
  ASSERT_TRUE(t.result.has_value());
  EXPECT_EQ(t.result->status().code(), absl::StatusCode::kAborted);
}

TEST_F(ReformationInboxTest, ManyPostersNoneLost) {
  std::vector<std::thread> posters;
  for (int i = 0; i < 8; ++i) {
    posters.emplace_back([&, i] {
      for (int k = 0; k < 100; ++k) inbox_.PostError(std::to_string(i));
    });
  }
  int taken = 0;
  for (std::thread& t : posters) t.join();
  while (inbox_.pending()) taken += inbox_.Take().error.has_value();
  EXPECT_EQ(taken, 1);
  EXPECT_EQ(wakes_.load(), 800);
}

TEST_F(ReformationInboxTest, AfterCloseNothingIsKept) {
  inbox_.PostError("bucket 3: reset");
  inbox_.PostResult(Result(1));
  inbox_.Close();
  EXPECT_EQ(destroyed_.load(), 1);  // its reducer never ran anything
  EXPECT_FALSE(inbox_.pending());
  const int wakes = wakes_.load();
  inbox_.PostError("late");
  inbox_.PostRequest("late");
  inbox_.PostResult(Result(2));
  EXPECT_EQ(destroyed_.load(), 2);
  EXPECT_EQ(wakes_.load(), wakes);  // a stopped job's engine is not woken
  EXPECT_FALSE(inbox_.pending());
  ReformationInbox::Taken t = inbox_.Take();
  EXPECT_FALSE(t.error.has_value());
  EXPECT_FALSE(t.request.has_value());
  EXPECT_FALSE(t.result.has_value());
}

}  // namespace
}  // namespace gradd
