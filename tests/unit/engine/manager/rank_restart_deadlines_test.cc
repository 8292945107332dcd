// RankRestartDeadlines (server/engine/manager/rank_restart_deadlines.h)
// driven by hand with a fake clock: ranks go away and come back, the
// earliest deadline is the control loop's next wake-up, and the end of the
// grace fails the job naming its first rank while every rank still away is
// gone.
#include "server/engine/manager/rank_restart_deadlines.h"

#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(RankRestartDeadlinesTest, AwayUntilTheGraceRunsOut) {
  RankRestartDeadlines d("j", 3, absl::Seconds(10));
  EXPECT_TRUE(d.has_grace());
  EXPECT_EQ(d.grace_ms(), 10000u);
  EXPECT_EQ(d.NextDeadline(), absl::InfiniteFuture());
  EXPECT_THAT(d.AwayRanks(), IsEmpty());
  EXPECT_EQ(d.Away(1, kT0), kT0 + absl::Seconds(10));
  EXPECT_TRUE(d.away(1));
  EXPECT_FALSE(d.away(0));
  EXPECT_EQ(d.deadline(1), kT0 + absl::Seconds(10));
  EXPECT_EQ(d.deadline(0), absl::InfiniteFuture());
  d.Away(2, kT0 + absl::Seconds(3));
  EXPECT_THAT(d.AwayRanks(), ElementsAre(1, 2));
  EXPECT_EQ(d.NextDeadline(), kT0 + absl::Seconds(10));
}

TEST(RankRestartDeadlinesTest, ARankBackOrGoneHasNoDeadline) {
  RankRestartDeadlines d("j", 2, absl::Seconds(10));
  d.Away(0, kT0);
  d.Away(1, kT0 + absl::Seconds(1));
  d.Clear(0);  // re-attached
  EXPECT_FALSE(d.away(0));
  EXPECT_EQ(d.NextDeadline(), kT0 + absl::Seconds(11));
  d.Clear(1);  // detached for good
  EXPECT_EQ(d.NextDeadline(), absl::InfiniteFuture());
  EXPECT_FALSE(d.Expire(kT0 + absl::Hours(1)).has_value())
      << "nobody away, nothing expires";
  // It may go away again: a fresh grace from then.
  d.Away(0, kT0 + absl::Seconds(30));
  EXPECT_EQ(d.deadline(0), kT0 + absl::Seconds(40));
}

TEST(RankRestartDeadlinesTest, NothingExpiresBeforeTheDeadline) {
  RankRestartDeadlines d("j", 2, absl::Milliseconds(500));
  d.Away(1, kT0);
  EXPECT_FALSE(d.Expire(kT0 + absl::Milliseconds(499)).has_value());
  EXPECT_TRUE(d.away(1));
}

TEST(RankRestartDeadlinesTest, TheEndOfTheGraceNamesTheRankAndTakesEveryAway) {
  RankRestartDeadlines d("train", 4, absl::Seconds(10));
  d.Away(3, kT0);
  d.Away(1, kT0 + absl::Seconds(2));
  d.Away(2, kT0 + absl::Seconds(4));
  // At kT0 + 12 s ranks 3 and 1 are past their deadline (1 first by rank),
  // rank 2 is not yet, but the failed job waits for nobody.
  std::optional<RankRestartDeadlines::Expiry> e =
      d.Expire(kT0 + absl::Seconds(12));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(e->status.message(),
            "local rank 1 of job 'train' did not re-attach within "
            "rank_restart_grace_ms=10000 after its process went away");
  EXPECT_THAT(e->gone, ElementsAre(1, 2, 3));
  EXPECT_THAT(d.AwayRanks(), IsEmpty());
  EXPECT_EQ(d.NextDeadline(), absl::InfiniteFuture());
  EXPECT_FALSE(d.Expire(kT0 + absl::Seconds(60)).has_value()) << "once";
}

TEST(RankRestartDeadlinesTest, ExpiresExactlyAtTheDeadline) {
  RankRestartDeadlines d("j", 1, absl::Seconds(1));
  d.Away(0, kT0);
  std::optional<RankRestartDeadlines::Expiry> e =
      d.Expire(kT0 + absl::Seconds(1));
  ASSERT_TRUE(e.has_value());
  EXPECT_THAT(e->gone, ElementsAre(0));
}

TEST(RankRestartDeadlinesTest, NoGraceNoWait) {
  RankRestartDeadlines d("j", 2, absl::ZeroDuration());
  EXPECT_FALSE(d.has_grace());
  EXPECT_EQ(d.Away(0, kT0), absl::InfiniteFuture());
  EXPECT_FALSE(d.away(0));
  EXPECT_FALSE(RankRestartDeadlines().has_grace());
  EXPECT_FALSE(RankRestartDeadlines("j", 1, -absl::Seconds(1)).has_grace());
}

TEST(RankRestartDeadlinesTest, RanksOutsideTheJobAreNeverAway) {
  RankRestartDeadlines d("j", 2, absl::Seconds(1));
  EXPECT_EQ(d.Away(2, kT0), absl::InfiniteFuture());
  EXPECT_EQ(d.Away(-1, kT0), absl::InfiniteFuture());
  d.Clear(7);
  EXPECT_FALSE(d.away(2));
  EXPECT_EQ(d.deadline(-1), absl::InfiniteFuture());
  EXPECT_EQ(d.NextDeadline(), absl::InfiniteFuture());
}

}  // namespace
}  // namespace gradd
