// PlanSwitchRequests driven by hand: the test plays the rebuild
// coordinator's thread (expecting a rebuild, posting the switch) and the
// engine thread (looking at the switch, taking it, aborting it).
#include "server/engine/job/plan_switch_requests.h"

#include <atomic>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace gradd {
namespace {

BucketPlan PlanOf(int buckets) {
  BucketPlan plan;
  plan.buckets.resize(buckets);
  return plan;
}

class PlanSwitchRequestsTest : public ::testing::Test {
 protected:
  PlanSwitchRequests::Done Record() {
    return [this](absl::Status s) { answers_.push_back(std::move(s)); };
  }

  std::atomic<int> wakes_{0};
  PlanSwitchRequests requests_{"j", [this] { wakes_.fetch_add(1); }};
  std::vector<absl::Status> answers_;
};

TEST_F(PlanSwitchRequestsTest, ExpectRebuildUntilCleared) {
  EXPECT_EQ(requests_.rebuild_after(), 0u);
  EXPECT_FALSE(requests_.in_play());
  std::thread coordinator([&] { requests_.ExpectRebuild(7); });
  coordinator.join();
  EXPECT_EQ(wakes_.load(), 1);  // the engine checks nobody ran ahead
  EXPECT_EQ(requests_.rebuild_after(), 7u);
  EXPECT_TRUE(requests_.in_play());
  EXPECT_FALSE(requests_.pending());
  requests_.ClearRebuild();
  EXPECT_EQ(requests_.rebuild_after(), 0u);
  EXPECT_FALSE(requests_.in_play());
}

TEST_F(PlanSwitchRequestsTest, PostedFromAnotherThreadThenTaken) {
  EXPECT_FALSE(requests_.iteration().has_value());
  EXPECT_FALSE(requests_.Take().has_value());
  std::thread coordinator([&] { requests_.Post(7, PlanOf(3), Record()); });
  coordinator.join();
  EXPECT_EQ(wakes_.load(), 1);
  ASSERT_TRUE(requests_.pending());
  EXPECT_TRUE(requests_.in_play());
  // Looking does not take it.
  ASSERT_EQ(requests_.iteration(), std::optional<uint64_t>(7));
  EXPECT_TRUE(requests_.pending());
  std::optional<PlanSwitchRequests::Request> r = requests_.Take();
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(requests_.pending());
  EXPECT_EQ(r->iteration, 7u);
  EXPECT_EQ(r->plan.buckets.size(), 3u);
  EXPECT_TRUE(answers_.empty());  // the engine answers once switched
  std::move(r->done)(absl::OkStatus());
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_TRUE(answers_[0].ok());
}

TEST_F(PlanSwitchRequestsTest, OneAtATime) {
  requests_.Post(7, PlanOf(3), Record());
  requests_.Post(8, PlanOf(2), Record());
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_EQ(answers_[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(answers_[0].message(), "job 'j' is already switching bucket plans");
  EXPECT_EQ(requests_.iteration(), std::optional<uint64_t>(7));
  ASSERT_TRUE(requests_.Take().has_value());
  // Taken: the next one is welcome.
  requests_.Post(9, PlanOf(1), Record());
  EXPECT_EQ(answers_.size(), 1u);
  EXPECT_EQ(requests_.iteration(), std::optional<uint64_t>(9));
}

TEST_F(PlanSwitchRequestsTest, AbortAnswersTheSwitchWaiting) {
  requests_.Abort(absl::AbortedError("job failed"));  // none: nothing
  EXPECT_TRUE(answers_.empty());
  requests_.Post(7, PlanOf(3), Record());
  requests_.Abort(absl::AbortedError("job failed"));
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_EQ(answers_[0].code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(requests_.pending());
  // Stopping (OK): CANCELLED, naming the job.
  requests_.Post(8, PlanOf(3), Record());
  requests_.Abort(absl::OkStatus());
  ASSERT_EQ(answers_.size(), 2u);
  EXPECT_EQ(answers_[1].code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(answers_[1].message(), "job 'j' stopped during a bucket rebuild");
}

}  // namespace
}  // namespace gradd
