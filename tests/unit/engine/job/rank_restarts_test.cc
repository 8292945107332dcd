// RankRestarts driven by hand: done sequences in, the abort and the "behind
// an abort" verdicts out (no Job, no control block, no threads).
#include "server/engine/job/rank_restarts.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace gradd {
namespace {

RankRestarts::IterationAbort Plan(const std::vector<uint64_t>& done) {
  return RankRestarts::PlanIterationAbort(done.size(),
                                          [&](size_t b) { return done[b]; });
}

TEST(RankRestartsTest, CanWaitOnlyWithGraceAndNothingInPlay) {
  RankRestarts::Situation s;
  EXPECT_FALSE(RankRestarts::CanWait(s));  // no grace
  s.has_grace = true;
  EXPECT_TRUE(RankRestarts::CanWait(s));
  RankRestarts::Situation with = s;
  with.plan_switch_in_play = true;
  EXPECT_FALSE(RankRestarts::CanWait(with));
  with = s;
  with.failed = true;
  EXPECT_FALSE(RankRestarts::CanWait(with));
  with = s;
  with.join_open = true;
  EXPECT_FALSE(RankRestarts::CanWait(with));
}

TEST(RankRestartsTest, NoIterationInProgressAbortsTheNext) {
  const RankRestarts::IterationAbort a = Plan({5, 5, 5});
  EXPECT_EQ(a.iteration, 6u);
  EXPECT_EQ(a.last, 6u);
}

TEST(RankRestartsTest, IterationInProgressIsTheOneAborted) {
  // Bucket 0 done for 6, the others not: 6 is in progress.
  const RankRestarts::IterationAbort a = Plan({6, 5, 5});
  EXPECT_EQ(a.iteration, 6u);
  EXPECT_EQ(a.last, 6u);
}

TEST(RankRestartsTest, FreshJobAbortsIterationOne) {
  const RankRestarts::IterationAbort a = Plan({0, 0});
  EXPECT_EQ(a.iteration, 1u);
  EXPECT_EQ(a.last, 1u);
}

TEST(RankRestartsTest, NoBucketsNoIteration) {
  const RankRestarts::IterationAbort a = Plan({});
  EXPECT_EQ(a.iteration, 0u);
  EXPECT_EQ(a.last, 0u);
}

TEST(RankRestartsTest, RunsOfConsecutiveAborts) {
  RankRestarts r;
  EXPECT_EQ(r.iteration_run_start(), 0u);
  r.NoteIterationAbort(/*previous=*/0, 6);
  EXPECT_EQ(r.iteration_run_start(), 6u);
  r.NoteIterationAbort(6, 7);  // the next one: same run
  EXPECT_EQ(r.iteration_run_start(), 6u);
  r.NoteIterationAbort(7, 8);
  EXPECT_EQ(r.iteration_run_start(), 6u);
  r.NoteIterationAbort(8, 12);  // a gap: a new run
  EXPECT_EQ(r.iteration_run_start(), 12u);

  r.NoteRoundAbort(0, 3);
  r.NoteRoundAbort(3, 4);
  EXPECT_EQ(r.round_run_start(), 3u);
  r.NoteRoundAbort(4, 4);  // not the next: starts over
  EXPECT_EQ(r.round_run_start(), 4u);
  // Rounds and iterations are separate runs.
  EXPECT_EQ(r.iteration_run_start(), 12u);
}

TEST(RankRestartsTest, BehindOneAbort) {
  // Iteration 6 aborted (done = 6): a rank still at 5 is behind it, not
  // in error; one at 4 is two behind.
  EXPECT_TRUE(RankRestarts::BehindAbort(5, 6, 6, 0));
  EXPECT_FALSE(RankRestarts::BehindAbort(4, 6, 6, 0));
  // Nothing aborted, or the abort is not the done one.
  EXPECT_FALSE(RankRestarts::BehindAbort(5, 6, 0, 0));
  EXPECT_FALSE(RankRestarts::BehindAbort(5, 7, 6, 0));
  // At done or past it: not lagging.
  EXPECT_FALSE(RankRestarts::BehindAbort(6, 6, 6, 0));
}

TEST(RankRestartsTest, BehindARunOfAborts) {
  RankRestarts r;
  r.NoteIterationAbort(0, 6);
  r.NoteIterationAbort(6, 7);
  r.NoteIterationAbort(7, 8);
  // A rank still at 5 (before the first of 6, 7, 8) is behind the run.
  EXPECT_TRUE(r.BehindIterationAbort(5, 8, 8));
  EXPECT_TRUE(r.BehindIterationAbort(7, 8, 8));
  EXPECT_FALSE(r.BehindIterationAbort(4, 8, 8));
  // Rounds track their own run (none yet): only one behind counts.
  EXPECT_FALSE(r.BehindRoundAbort(5, 8, 8));
  EXPECT_TRUE(r.BehindRoundAbort(7, 8, 8));
}

}  // namespace
}  // namespace gradd
