// JoinState driven by hand: rank views in, rounds and outcomes out (no
// control block, no threads). Multi-node rounds are summed here the way the
// reducer's allreduce would.
#include "server/engine/job/join_state.h"

#include <vector>

#include "absl/status/status.h"
#include "common/control_block.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;
using Phase = JoinState::Phase;
using Kind = JoinState::Kind;

constexpr uint32_t kDivide = kJoinDivideByInitialWorldSize;

// `n` ranks that all entered join before iteration `begin`.
std::vector<JoinRankView> Entered(int n, uint64_t begin, uint32_t flags) {
  std::vector<JoinRankView> v(n);
  for (JoinRankView& r : v) {
    r.join_seq = 1;
    r.begin = begin;
    r.flags = flags;
  }
  return v;
}

std::vector<double> Sum(const std::vector<double>& a,
                        const std::vector<double>& b) {
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

// Polls until a round comes out (asserting it does), resolves it alone.
JoinState::Outcome Round(JoinState& s, const std::vector<JoinRankView>& v,
                         uint64_t next) {
  absl::StatusOr<std::vector<double>> round = s.Poll(v, next);
  EXPECT_TRUE(round.ok()) << round.status();
  EXPECT_FALSE(round->empty());
  absl::StatusOr<JoinState::Outcome> out = s.Resolve(*round);
  EXPECT_TRUE(out.ok()) << out.status();
  return *out;
}

TEST(JoinStateTest, PlainJobsStayOff) {
  JoinState s("job", 2, 0, 2, 1);
  std::vector<JoinRankView> v(2);
  absl::StatusOr<std::vector<double>> round = s.Poll(v, 1);
  ASSERT_TRUE(round.ok());
  EXPECT_TRUE(round->empty());
  EXPECT_EQ(s.phase(), Phase::kOff);
}

TEST(JoinStateTest, WaitsForEveryRankToEnterThenToDecide) {
  JoinState s("job", 2, 0, 2, 1);
  std::vector<JoinRankView> v = Entered(2, 4, kDivide);
  v[1].join_seq = 0;  // rank 1 has not entered yet
  ASSERT_TRUE(s.Poll(v, 4)->empty());
  EXPECT_EQ(s.phase(), Phase::kOff);
  v[1] = v[0];
  ASSERT_TRUE(s.Poll(v, 4)->empty());  // entered, nobody decided
  EXPECT_EQ(s.phase(), Phase::kCollecting);
  EXPECT_EQ(s.iteration(), 4u);
  v[0].active_seq = 4;
  ASSERT_TRUE(s.Poll(v, 4)->empty());  // rank 1 still undecided
  v[1].active_seq = 4;
  absl::StatusOr<std::vector<double>> round = s.Poll(v, 4);
  ASSERT_TRUE(round.ok());
  ASSERT_EQ(round->size(), 6u);
  EXPECT_EQ(s.phase(), Phase::kRound);
}

TEST(JoinStateTest, UnevenInputsDivideByInitialWorldSize) {
  JoinState s("job", 3, 0, 3, 1);
  std::vector<JoinRankView> v = Entered(3, 1, kDivide);
  for (JoinRankView& r : v) r.active_seq = 1;
  JoinState::Outcome o = Round(s, v, 1);
  EXPECT_EQ(o.kind, Kind::kContinue);
  EXPECT_EQ(o.divisor, 3);
  EXPECT_EQ(o.max_active, 2);
  EXPECT_THAT(o.local_active, ::testing::ElementsAre(true, true, true));
  s.IterationDone();
  // Rank 2 runs out first: the highest active rank is 1 now.
  v[0].active_seq = v[1].active_seq = 2;
  v[2].joined_at = 2;
  o = Round(s, v, 2);
  EXPECT_EQ(o.kind, Kind::kContinue);
  EXPECT_EQ(o.divisor, 3);  // still the initial world size
  EXPECT_EQ(o.max_active, 1);
  EXPECT_EQ(o.global_active, 2);
  EXPECT_THAT(o.local_active, ::testing::ElementsAre(true, true, false));
  s.IterationDone();
  // Ranks 0 and 1 run out together: they are the last joiners, 1 wins.
  v[0].joined_at = v[1].joined_at = 3;
  o = Round(s, v, 3);
  EXPECT_EQ(o.kind, Kind::kComplete);
  EXPECT_EQ(o.authoritative_rank, 1);
  EXPECT_EQ(o.iteration, 3u);
  EXPECT_EQ(s.phase(), Phase::kOff);
  EXPECT_EQ(s.done_join_seq(), 1u);
}

TEST(JoinStateTest, DivideByActiveRanks) {
  JoinState s("job", 2, 0, 2, 1);
  std::vector<JoinRankView> v = Entered(2, 1, /*flags=*/0);
  v[0].joined_at = 1;
  v[1].active_seq = 1;
  JoinState::Outcome o = Round(s, v, 1);
  EXPECT_EQ(o.kind, Kind::kContinue);
  EXPECT_EQ(o.divisor, 1);
  EXPECT_EQ(o.max_active, 1);
}

TEST(JoinStateTest, NoRankWithInputsCompletesAtOnceFromTheHighestRank) {
  JoinState s("job", 2, 0, 2, 1);
  std::vector<JoinRankView> v = Entered(2, 7, kDivide);
  v[0].joined_at = v[1].joined_at = 7;
  JoinState::Outcome o = Round(s, v, 7);
  EXPECT_EQ(o.kind, Kind::kComplete);
  EXPECT_EQ(o.authoritative_rank, 1);
}

TEST(JoinStateTest, ThrowOnEarlyTerminationNamesTheRank) {
  JoinState s("job", 3, 0, 3, 1);
  std::vector<JoinRankView> v =
      Entered(3, 1, kDivide | kJoinThrowOnEarlyTermination);
  for (JoinRankView& r : v) r.active_seq = 1;
  EXPECT_EQ(Round(s, v, 1).kind, Kind::kContinue);
  s.IterationDone();
  v[0].active_seq = 2;
  v[1].joined_at = 2;
  v[2].joined_at = 2;
  JoinState::Outcome o = Round(s, v, 2);
  EXPECT_EQ(o.kind, Kind::kThrown);
  EXPECT_EQ(o.exhausted_rank, 1);
  EXPECT_EQ(s.phase(), Phase::kOff);
}

TEST(JoinStateTest, ThrowModeRanksRunningOutTogetherDoNotThrow) {
  JoinState s("job", 2, 0, 2, 1);
  std::vector<JoinRankView> v = Entered(2, 1, kJoinThrowOnEarlyTermination);
  v[0].joined_at = v[1].joined_at = 1;
  JoinState::Outcome o = Round(s, v, 1);
  EXPECT_EQ(o.kind, Kind::kComplete);
  EXPECT_EQ(o.authoritative_rank, 1);
}

TEST(JoinStateTest, SyncBytesMustAgree) {
  JoinState s("job", 2, 0, 2, 1);
  std::vector<JoinRankView> v = Entered(2, 1, kDivide);
  v[0].active_seq = v[1].active_seq = 1;
  v[0].sync_bytes = 64;
  v[1].sync_bytes = 64;
  EXPECT_EQ(Round(s, v, 1).sync_bytes, 64u);
  s.IterationDone();
  v[0].active_seq = v[1].active_seq = 2;
  v[1].sync_bytes = 32;
  absl::StatusOr<std::vector<double>> round = s.Poll(v, 2);
  ASSERT_TRUE(round.ok());
  absl::StatusOr<JoinState::Outcome> o = s.Resolve(*round);
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(o.status().message(), HasSubstr("disagree on the join sync"));
}

TEST(JoinStateTest, MisuseIsNamed) {
  {
    JoinState s("job", 2, 0, 2, 1);
    std::vector<JoinRankView> v = Entered(2, 1, kDivide);
    v[1].flags = 0;
    absl::Status st = s.Poll(v, 1).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(st.message(), HasSubstr("divide_by_initial_world_size=False"));
  }
  {
    JoinState s("job", 2, 0, 2, 1);
    std::vector<JoinRankView> v = Entered(2, 1, kDivide);
    v[1].join_seq = 0;
    v[1].published = true;
    absl::Status st = s.Poll(v, 1).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(st.message(), HasSubstr("local rank 1"));
    EXPECT_THAT(st.message(), HasSubstr("without entering join mode"));
  }
  {
    JoinState s("job", 2, 0, 2, 1);
    std::vector<JoinRankView> v = Entered(2, 3, kDivide);
    absl::Status st = s.Poll(v, 5).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(st.message(), HasSubstr("iteration 5 is next"));
  }
  {
    JoinState s("job", 2, 0, 2, 1);
    std::vector<JoinRankView> v = Entered(2, 1, kDivide);
    v[0].active_seq = 1;
    v[1].live = false;
    absl::Status st = s.Poll(v, 1).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
    EXPECT_THAT(st.message(), HasSubstr("left during join"));
  }
}

TEST(JoinStateTest, TwoNodesSeeEveryRank) {
  // Node a: global ranks 0, 1 (both ran out); node b: ranks 2, 3.
  JoinState a("job", 2, 0, 4, 2);
  JoinState b("job", 2, 2, 4, 2);
  std::vector<JoinRankView> va = Entered(2, 1, 0);
  std::vector<JoinRankView> vb = Entered(2, 1, 0);
  va[0].joined_at = va[1].joined_at = 1;
  vb[0].active_seq = vb[1].active_seq = 1;
  absl::StatusOr<std::vector<double>> ra = a.Poll(va, 1);
  absl::StatusOr<std::vector<double>> rb = b.Poll(vb, 1);
  ASSERT_TRUE(ra.ok() && rb.ok());
  const std::vector<double> sum = Sum(*ra, *rb);
  absl::StatusOr<JoinState::Outcome> oa = a.Resolve(sum);
  absl::StatusOr<JoinState::Outcome> ob = b.Resolve(sum);
  ASSERT_TRUE(oa.ok() && ob.ok());
  // Node a has nobody active but must keep running the iteration.
  EXPECT_EQ(oa->kind, Kind::kContinue);
  EXPECT_THAT(oa->local_active, ::testing::ElementsAre(false, false));
  EXPECT_EQ(oa->divisor, 2);
  EXPECT_EQ(oa->max_active, 3);
  EXPECT_EQ(ob->max_active, 3);
  EXPECT_THAT(ob->local_active, ::testing::ElementsAre(true, true));
}

TEST(JoinStateTest, NodesThatDisagreeFail) {
  JoinState a("job", 1, 0, 2, 2);
  JoinState b("job", 1, 1, 2, 2);
  std::vector<JoinRankView> va = Entered(1, 1, kDivide);
  std::vector<JoinRankView> vb = Entered(1, 2, kDivide);  // a later iteration
  va[0].active_seq = 1;
  vb[0].active_seq = 2;
  absl::StatusOr<std::vector<double>> ra = a.Poll(va, 1);
  absl::StatusOr<std::vector<double>> rb = b.Poll(vb, 2);
  ASSERT_TRUE(ra.ok() && rb.ok());
  absl::Status st = a.Resolve(Sum(*ra, *rb)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("the nodes disagree on join"));
}

}  // namespace
}  // namespace gradd
