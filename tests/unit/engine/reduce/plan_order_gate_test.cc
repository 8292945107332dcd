// PlanOrderGate (server/engine/reduce/plan_order_gate.h): buckets started out
// of plan order are released in plan order.
#include "server/engine/reduce/plan_order_gate.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Records "i.b" when an item runs OK, "i.b:<code>" when it runs with an
// error.
PlanOrderGate::Issue Record(std::vector<std::string>* log, uint64_t i, int b) {
  return [log, i, b](absl::Status s) {
    log->push_back(s.ok() ? absl::StrCat(i, ".", b)
                          : absl::StrCat(i, ".", b, ":",
                                         absl::StatusCodeToString(s.code())));
  };
}

TEST(PlanOrderGateTest, InOrderRunsAtOnce) {
  PlanOrderGate gate(std::vector<bool>(2, true));
  std::vector<std::string> log;
  gate.Arrive(1, 0, Record(&log, 1, 0));
  gate.Arrive(1, 1, Record(&log, 1, 1));
  gate.Arrive(2, 0, Record(&log, 2, 0));
  EXPECT_THAT(log, ElementsAre("1.0", "1.1", "2.0"));
  EXPECT_EQ(gate.held(), 0u);
}

TEST(PlanOrderGateTest, EarlyBucketWaitsForItsPredecessors) {
  PlanOrderGate gate(std::vector<bool>(3, true));
  std::vector<std::string> log;
  gate.Arrive(1, 2, Record(&log, 1, 2));
  gate.Arrive(1, 1, Record(&log, 1, 1));
  EXPECT_THAT(log, IsEmpty());
  EXPECT_EQ(gate.held(), 2u);
  gate.Arrive(1, 0, Record(&log, 1, 0));
  EXPECT_THAT(log, ElementsAre("1.0", "1.1", "1.2"));
  EXPECT_EQ(gate.held(), 0u);
}

TEST(PlanOrderGateTest, PassThroughBucketsMoveTheCursorOnly) {
  // Bucket 1 goes another way (null item): bucket 2 still waits for it.
  PlanOrderGate gate(std::vector<bool>(3, true));
  std::vector<std::string> log;
  gate.Arrive(1, 2, Record(&log, 1, 2));
  gate.Arrive(1, 0, Record(&log, 1, 0));
  EXPECT_THAT(log, ElementsAre("1.0"));
  gate.Arrive(1, 1, nullptr);
  EXPECT_THAT(log, ElementsAre("1.0", "1.2"));
}

TEST(PlanOrderGateTest, NextIterationWaitsForTheWholeCurrentOne) {
  PlanOrderGate gate(std::vector<bool>(2, true));
  std::vector<std::string> log;
  gate.Arrive(1, 0, Record(&log, 1, 0));
  gate.Arrive(2, 0, Record(&log, 2, 0));
  EXPECT_THAT(log, ElementsAre("1.0"));
  gate.Arrive(1, 1, nullptr);
  EXPECT_THAT(log, ElementsAre("1.0", "2.0"));
}

TEST(PlanOrderGateTest, BucketsOutsideTheSequenceRunAtOnceAndAreNotAwaited) {
  // Buckets 0 and 2 are CPU buckets (say the used map): bucket 1 does not
  // wait for bucket 0, bucket 3 waits only for bucket 1.
  PlanOrderGate gate({false, true, false, true});
  std::vector<std::string> log;
  gate.Arrive(1, 3, Record(&log, 1, 3));
  gate.Arrive(1, 2, Record(&log, 1, 2));
  EXPECT_THAT(log, ElementsAre("1.2"));
  gate.Arrive(1, 1, Record(&log, 1, 1));
  EXPECT_THAT(log, ElementsAre("1.2", "1.1", "1.3"));
  gate.Arrive(2, 1, Record(&log, 2, 1));
  gate.Arrive(2, 0, Record(&log, 2, 0));
  EXPECT_THAT(log, ElementsAre("1.2", "1.1", "1.3", "2.1", "2.0"));
}

TEST(PlanOrderGateTest, NoOrderedBucketsMeansEverythingRunsAtOnce) {
  PlanOrderGate gate({false, false});
  std::vector<std::string> log;
  gate.Arrive(3, 1, Record(&log, 3, 1));
  gate.Arrive(1, 0, Record(&log, 1, 0));
  EXPECT_THAT(log, ElementsAre("3.1", "1.0"));
}

TEST(PlanOrderGateTest, StartedTwiceOrOutsideThePlanFailsThatItem) {
  PlanOrderGate gate(std::vector<bool>(2, true));
  std::vector<std::string> log;
  gate.Arrive(1, 0, Record(&log, 1, 0));
  gate.Arrive(1, 0, Record(&log, 1, 0));
  gate.Arrive(1, 5, Record(&log, 1, 5));
  EXPECT_THAT(log, ElementsAre("1.0", "1.0:INTERNAL", "1.5:INTERNAL"));
  gate.Arrive(1, 1, Record(&log, 1, 1));
  EXPECT_EQ(log.back(), "1.1");
}

TEST(PlanOrderGateTest, CancelAndDestructionAnswerHeldItems) {
  std::vector<std::string> log;
  {
    PlanOrderGate gate(std::vector<bool>(2, true));
    gate.Arrive(1, 1, Record(&log, 1, 1));
    gate.Cancel(absl::AbortedError("peer gone"));
    EXPECT_THAT(log, ElementsAre("1.1:ABORTED"));
    gate.Arrive(2, 1, Record(&log, 2, 1));
  }
  EXPECT_THAT(log, ElementsAre("1.1:ABORTED", "2.1:CANCELLED"));
}

TEST(PlanOrderGateTest, ReplanRestartsTheCursorWithTheNewBucketCount) {
  PlanOrderGate gate(std::vector<bool>(2, true));
  std::vector<std::string> log;
  gate.Arrive(1, 0, Record(&log, 1, 0));
  gate.Arrive(1, 1, Record(&log, 1, 1));
  gate.Replan(2, std::vector<bool>(3, true));
  gate.Arrive(2, 2, Record(&log, 2, 2));
  gate.Arrive(2, 1, Record(&log, 2, 1));
  EXPECT_THAT(log, ElementsAre("1.0", "1.1"));
  gate.Arrive(2, 0, Record(&log, 2, 0));
  EXPECT_THAT(log, ElementsAre("1.0", "1.1", "2.0", "2.1", "2.2"));
  gate.Arrive(3, 0, Record(&log, 3, 0));
  EXPECT_EQ(log.back(), "3.0");
}

}  // namespace
}  // namespace gradd
