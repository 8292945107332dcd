// PendingJob (server/engine/manager/pending_job.h) driven by hand: local
// ranks attach until the job is complete, leave again, time out while it
// collects (never while it forms), and every attach is taken out exactly
// once.
#include "server/engine/manager/pending_job.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace gradd {
namespace {

PendingRank Attach(uint64_t session, absl::Time deadline) {
  PendingRank r;
  r.request.set_session_id(session);
  r.deadline = deadline;
  return r;
}

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(PendingJobTest, CompleteOnceEveryLocalRankIsIn) {
  PendingJob p(3);
  EXPECT_EQ(p.world(), 3);
  EXPECT_TRUE(p.empty());
  EXPECT_EQ(p.Missing(), (std::vector<int>{0, 1, 2}));
  EXPECT_FALSE(p.Add(2, Attach(12, kT0)));
  EXPECT_FALSE(p.Add(0, Attach(10, kT0)));
  EXPECT_EQ(p.count(), 2);
  EXPECT_EQ(p.Missing(), (std::vector<int>{1}));
  EXPECT_TRUE(p.Add(1, Attach(11, kT0)));
  EXPECT_TRUE(p.complete());
  EXPECT_EQ(p.rank(1)->request.session_id(), 11u);
}

TEST(PendingJobTest, TakeFreesTheSlotOnce) {
  PendingJob p(2);
  p.Add(0, Attach(10, kT0));
  std::optional<PendingRank> taken = p.Take(0);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->request.session_id(), 10u);
  EXPECT_TRUE(p.empty());
  EXPECT_FALSE(p.rank(0).has_value());
  EXPECT_FALSE(p.Take(0).has_value()) << "nothing left to take";
  EXPECT_FALSE(p.Take(1).has_value()) << "never attached";
  EXPECT_EQ(p.count(), 0);
  // The slot is free for another attach of that rank.
  EXPECT_FALSE(p.Add(0, Attach(20, kT0)));
  EXPECT_EQ(p.rank(0)->request.session_id(), 20u);
}

TEST(PendingJobTest, ExpiredAttachesAreTakenAtTheirDeadline) {
  PendingJob p(3);
  p.Add(0, Attach(10, kT0));
  p.Add(1, Attach(11, kT0 + absl::Seconds(5)));
  EXPECT_EQ(p.NextDeadline(), kT0);
  EXPECT_TRUE(p.TakeExpired(kT0 - absl::Milliseconds(1)).empty());
  std::vector<std::pair<int, PendingRank>> expired = p.TakeExpired(kT0);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].first, 0);
  EXPECT_EQ(expired[0].second.request.session_id(), 10u);
  EXPECT_EQ(p.count(), 1);
  EXPECT_EQ(p.NextDeadline(), kT0 + absl::Seconds(5));
  EXPECT_EQ(p.TakeExpired(kT0 + absl::Seconds(60)).size(), 1u);
  EXPECT_TRUE(p.empty());
  EXPECT_EQ(p.NextDeadline(), absl::InfiniteFuture());
}

TEST(PendingJobTest, AFormingJobIsNotTimedOutRankByRank) {
  PendingJob p(2);
  p.Add(0, Attach(10, kT0));
  p.Add(1, Attach(11, kT0));
  EXPECT_FALSE(p.forming());
  p.StartForming(7);
  EXPECT_TRUE(p.forming());
  EXPECT_EQ(p.formation(), 7u);
  // Its formation is bounded by the earliest deadline instead.
  EXPECT_EQ(p.NextDeadline(), absl::InfiniteFuture());
  EXPECT_TRUE(p.TakeExpired(kT0 + absl::Hours(1)).empty());
  EXPECT_EQ(p.count(), 2);
}

TEST(PendingJobTest, TakeAllEmptiesItInRankOrder) {
  PendingJob p(3);
  p.Add(2, Attach(12, kT0));
  p.Add(0, Attach(10, kT0));
  std::vector<PendingRank> all = p.TakeAll();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].request.session_id(), 10u);
  EXPECT_EQ(all[1].request.session_id(), 12u);
  EXPECT_TRUE(p.empty());
  EXPECT_TRUE(p.TakeAll().empty());
}

}  // namespace
}  // namespace gradd
