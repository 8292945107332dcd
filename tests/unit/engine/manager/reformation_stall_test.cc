#include "server/engine/manager/reformation_stall.h"

#include "gtest/gtest.h"

namespace gradd {
namespace {

TEST(ReformationStallTest, FailsAfterTheMaxInARowAtTheSameIteration) {
  ReformationStall stall;
  for (int i = 1; i < ReformationStall::kMaxInARow; ++i) {
    EXPECT_FALSE(stall.Observe(41)) << i;
    EXPECT_EQ(stall.in_a_row(), i);
  }
  EXPECT_TRUE(stall.Observe(41));
  EXPECT_EQ(stall.in_a_row(), ReformationStall::kMaxInARow);
}

TEST(ReformationStallTest, AnIterationCompletedInBetweenStartsAgain) {
  ReformationStall stall;
  // Nodes arriving one by one, an iteration between each: never stalled.
  for (uint64_t completed = 10; completed < 40; ++completed) {
    EXPECT_FALSE(stall.Observe(completed));
    EXPECT_EQ(stall.in_a_row(), 1);
  }
  for (int i = 1; i < ReformationStall::kMaxInARow; ++i) {
    EXPECT_FALSE(stall.Observe(40));
  }
  EXPECT_FALSE(stall.Observe(41));
  EXPECT_EQ(stall.in_a_row(), 1);
}

TEST(ReformationStallTest, TheFirstReformationAtIterationZeroCountsOnce) {
  ReformationStall stall;
  EXPECT_FALSE(stall.Observe(0));
  EXPECT_EQ(stall.in_a_row(), 1);
}

}  // namespace
}  // namespace gradd
