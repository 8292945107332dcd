#include "server/scheduling.h"

#include <thread>

#include "gtest/gtest.h"

namespace gradd {
namespace {

// Niceness is per thread on Linux, and a raised one cannot be lowered again
// without CAP_SYS_NICE: every change happens in a thread of its own.
template <typename Fn>
void InThread(Fn fn) {
  std::thread t(fn);
  t.join();
}

TEST(LowerThreadPriorityToTest, RaisesTheNicenessOfAThreadAheadOfTheFloor) {
  const int start = CurrentNiceness();
  if (start > 16) GTEST_SKIP() << "already at niceness " << start;
  int result = 0;
  int after = 0;
  InThread([&] {
    result = LowerThreadPriorityTo(start + 3);
    after = CurrentNiceness();
  });
  EXPECT_EQ(result, start + 3);
  EXPECT_EQ(after, start + 3);
}

TEST(LowerThreadPriorityToTest, KeepsANicenessAtOrBehindTheFloor) {
  const int start = CurrentNiceness();
  if (start > 16) GTEST_SKIP() << "already at niceness " << start;
  int at_floor = 0;
  int behind = 0;
  int after = 0;
  InThread([&] {
    LowerThreadPriorityTo(start + 3);
    at_floor = LowerThreadPriorityTo(start + 3);
    // A floor below the thread's niceness would raise its priority: no.
    behind = LowerThreadPriorityTo(start + 1);
    after = CurrentNiceness();
  });
  EXPECT_EQ(at_floor, start + 3);
  EXPECT_EQ(behind, start + 3);
  EXPECT_EQ(after, start + 3);
}

TEST(LowerThreadPriorityToTest, ChangesOnlyTheCallingThread) {
  const int start = CurrentNiceness();
  if (start > 16) GTEST_SKIP() << "already at niceness " << start;
  int other = 0;
  InThread([&] {
    LowerThreadPriorityTo(start + 3);
    // A thread it starts inherits its niceness.
    InThread([&] { other = CurrentNiceness(); });
  });
  EXPECT_EQ(CurrentNiceness(), start);
  EXPECT_EQ(other, start + 3);
  int sibling = 0;
  InThread([&] { sibling = CurrentNiceness(); });
  EXPECT_EQ(sibling, start);
}

}  // namespace
}  // namespace gradd
