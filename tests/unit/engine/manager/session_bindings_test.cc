// SessionBindings (server/engine/manager/session_bindings.h) driven by
// hand: a session holds one rank and a rank one session, a rank's calls
// act only through its session, and a rank or session freed either way is
// free on both sides.
#include "server/engine/manager/session_bindings.h"

#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

TEST(SessionBindingsTest, BindFindAndSessionOf) {
  SessionBindings b;
  EXPECT_EQ(b.Find(7), nullptr);
  EXPECT_EQ(b.SessionOf("j", 0), 0u);
  ASSERT_TRUE(b.Bind(7, "j", 1).ok());
  ASSERT_NE(b.Find(7), nullptr);
  EXPECT_EQ(b.Find(7)->job_id, "j");
  EXPECT_EQ(b.Find(7)->local_rank, 1);
  EXPECT_EQ(b.SessionOf("j", 1), 7u);
  EXPECT_EQ(b.SessionOf("j", 0), 0u);
  EXPECT_EQ(b.SessionOf("k", 1), 0u) << "another job's rank 1";
  EXPECT_TRUE(b.Holds(7, "j", 1));
  EXPECT_FALSE(b.Holds(7, "j", 0));
  EXPECT_FALSE(b.Holds(8, "j", 1));
  EXPECT_EQ(b.size(), 1u);
}

TEST(SessionBindingsTest, ASessionHoldsOneRankAndARankOneSession) {
  SessionBindings b;
  ASSERT_TRUE(b.Bind(7, "j", 0).ok());
  absl::Status again = b.Bind(7, "k", 0);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(again.message(),
            "session 7 is already attached as local rank 0 of job 'j'; each "
            "rank needs its own session");
  EXPECT_EQ(b.CheckFree(7), again);
  EXPECT_TRUE(b.CheckFree(8).ok());
  absl::Status taken = b.Bind(8, "j", 0);
  EXPECT_EQ(taken.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(taken.message(),
            "local rank 0 of job 'j' is already attached (session 7)");
  EXPECT_EQ(b.size(), 1u) << "a refused Bind changes nothing";
  EXPECT_EQ(b.Bind(0, "j", 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SessionBindingsTest, CallsActOnlyThroughTheRanksSession) {
  SessionBindings b;
  ASSERT_TRUE(b.Bind(7, "j", 0).ok());
  EXPECT_TRUE(b.CheckHolds(7, "j", 0).ok());
  absl::Status other = b.CheckHolds(8, "j", 0);
  EXPECT_EQ(other.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(other.message(),
            "local rank 0 of job 'j' is not attached through session 8");
  EXPECT_EQ(b.CheckHolds(7, "j", 1).code(), absl::StatusCode::kNotFound);
}

TEST(SessionBindingsTest, UnbindFreesBothSides) {
  SessionBindings b;
  ASSERT_TRUE(b.Bind(7, "j", 0).ok());
  ASSERT_TRUE(b.Bind(8, "j", 1).ok());
  std::optional<SessionBindings::Rank> r = b.Unbind(7);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->job_id, "j");
  EXPECT_EQ(r->local_rank, 0);
  EXPECT_EQ(b.SessionOf("j", 0), 0u);
  EXPECT_FALSE(b.Unbind(7).has_value()) << "once";
  // A restarted process takes the rank on a new session.
  EXPECT_TRUE(b.Bind(9, "j", 0).ok());
  EXPECT_EQ(b.UnbindRank("j", 1), 8u);
  EXPECT_EQ(b.Find(8), nullptr);
  EXPECT_EQ(b.UnbindRank("j", 1), 0u) << "once";
  EXPECT_TRUE(b.CheckFree(8).ok());
  EXPECT_EQ(b.size(), 1u);
  b.Clear();
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(b.SessionOf("j", 0), 0u);
}

}  // namespace
}  // namespace gradd
