// RankRestart (client/src/data/rank_restart.h) over a hand-made job header,
// written here as the daemon would (common/control_block.h, "Rank
// restart"): when a sync is due, what a rank offers and what it takes from
// the allreduce's result, the aborted iteration / round and its status, and
// when a rank that saw an abort must still wait for the daemon.
#include <climits>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "client/src/data/rank_restart.h"
#include "gmock/gmock.h"
#include "gradd/client.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Fixture {
  Fixture() : header(std::make_unique<ControlHeader>()) {}
  // The daemon re-attaching local rank `rank` and aborting iteration `i`
  // (0: none) and round `k` (0: none), in the protocol's order.
  void Reattach(int32_t rank, uint64_t i, uint64_t k) {
    header->aborted_rank.store(rank);
    if (i > 0) header->aborted_iteration.store(i);
    if (k > 0) header->aborted_round.store(k);
    header->restarts.fetch_add(1);
    header->sync_seq.fetch_add(1);
  }
  // Every rank's offers MIN-reduced, as the allreduce does.
  static void Reduce(const RankRestart::SyncOffer& a,
                     const RankRestart::SyncOffer& b, int64_t* out) {
    for (int v = 0; v < RankRestart::kSyncValues; ++v) {
      out[v] = std::min(a.values[v], b.values[v]);
    }
  }
  // A re-formation as one node's daemon publishes it ("Re-formation"):
  // aborts iteration `i` (0: none) with aborted_rank -1, then epoch, live
  // world size and state_behind, then sync_seq = `agreed` (the value every
  // node sets).
  void Reform(uint64_t i, uint64_t epoch, uint32_t world, bool behind,
              uint64_t agreed) {
    header->aborted_rank.store(-1);
    if (i > 0) header->aborted_iteration.store(i);
    header->epoch.store(epoch);
    header->world_size.store(world);
    header->state_behind.store(behind ? 1 : 0);
    header->sync_seq.store(agreed);
  }
  std::unique_ptr<ControlHeader> header;
};

TEST(RankRestartTest, NewJobHasNothingPending) {
  Fixture f;
  RankRestart r;
  r.Attach(f.header.get(), /*rejoined=*/false, /*grace_ms=*/5000, 0);
  EXPECT_FALSE(r.restarted());
  EXPECT_EQ(r.grace_ms(), 5000u);
  EXPECT_FALSE(r.SyncPending());
  EXPECT_FALSE(r.IterationAborted(1));
  EXPECT_FALSE(r.RoundAborted(1));
  EXPECT_EQ(r.restarts(), 0u);
}

TEST(RankRestartTest, SurvivorsAndRejoinedRankAgreeOnRootAndHandled) {
  Fixture f;
  RankRestart survivor;
  survivor.Attach(f.header.get(), false, 5000, 0);
  // Local rank 1 dies during iteration 4 and comes back.
  f.Reattach(1, 4, 0);
  RankRestart rejoined;
  rejoined.Attach(f.header.get(), true, 5000, f.header->sync_seq.load());
  EXPECT_TRUE(survivor.SyncPending());
  EXPECT_TRUE(rejoined.SyncPending());
  EXPECT_EQ(survivor.restarts(), 1u);

  const RankRestart::SyncOffer a = survivor.Offer(/*global_rank=*/0);
  const RankRestart::SyncOffer b = rejoined.Offer(/*global_rank=*/1);
  EXPECT_EQ(a.values[0], 0);
  EXPECT_EQ(b.values[0], INT32_MAX);  // holds no state yet
  int64_t reduced[RankRestart::kSyncValues];
  Fixture::Reduce(a, b, reduced);
  absl::StatusOr<int> ra = survivor.Agreed(a, reduced, "job 'j', local rank 0");
  absl::StatusOr<int> rb = rejoined.Agreed(b, reduced, "job 'j', local rank 1");
  ASSERT_TRUE(ra.ok()) << ra.status();
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(*ra, 0);
  EXPECT_EQ(*rb, 0);
  EXPECT_FALSE(survivor.SyncPending());
  // The rejoined rank holds the state once it computes with it.
  EXPECT_TRUE(rejoined.SyncPending());
  rejoined.NoteMarkReady();
  EXPECT_FALSE(rejoined.SyncPending());
  EXPECT_EQ(rejoined.Offer(1).values[0], 1);
}

TEST(RankRestartTest, MarkReadyBeforeAnySyncKeepsARejoinedRankUnsynced) {
  Fixture f;
  f.Reattach(0, 0, 0);
  RankRestart r;
  r.Attach(f.header.get(), true, 5000, f.header->sync_seq.load());
  r.NoteMarkReady();
  EXPECT_TRUE(r.SyncPending());
  EXPECT_EQ(r.Offer(3).values[0], INT32_MAX);
}

TEST(RankRestartTest, HandledIsTheLargestSyncSeqAnyRankRead) {
  Fixture f;
  RankRestart early, late;
  early.Attach(f.header.get(), false, 5000, 0);
  late.Attach(f.header.get(), false, 5000, 0);
  f.Reattach(1, 0, 0);
  // `early` reads before a second re-attach, `late` after it: both went
  // into the same round, so both count both re-attaches as handled.
  const RankRestart::SyncOffer a = early.Offer(0);
  f.Reattach(2, 0, 0);
  const RankRestart::SyncOffer b = late.Offer(1);
  int64_t reduced[RankRestart::kSyncValues];
  Fixture::Reduce(a, b, reduced);
  ASSERT_TRUE(early.Agreed(a, reduced, "r0").ok());
  ASSERT_TRUE(late.Agreed(b, reduced, "r1").ok());
  EXPECT_FALSE(early.SyncPending());
  EXPECT_FALSE(late.SyncPending());
}

TEST(RankRestartTest, NoRankHoldingTheStateIsAnError) {
  Fixture f;
  f.Reattach(0, 0, 0);
  RankRestart r;
  r.Attach(f.header.get(), true, 5000, 1);
  const RankRestart::SyncOffer o = r.Offer(0);
  absl::StatusOr<int> root = r.Agreed(o, o.values, "job 'solo', local rank 0");
  EXPECT_EQ(root.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(root.status().message(), HasSubstr("job 'solo'"));
  EXPECT_THAT(root.status().message(),
              HasSubstr("no rank holds the job's state"));
  EXPECT_TRUE(r.SyncPending());  // still due
}

TEST(RankRestartTest, AbortedIterationWaitsForTheReattachToFinish) {
  Fixture f;
  RankRestart r;
  r.Attach(f.header.get(), false, 5000, 0);
  // The daemon's step 1 is visible (done words and the verdict), its
  // sync_seq bump not yet: the rank must wait, or it would find no sync
  // pending and run ahead of the others.
  f.header->aborted_rank.store(1);
  f.header->aborted_iteration.store(6);
  EXPECT_TRUE(r.IterationAborted(6));
  EXPECT_FALSE(r.IterationAborted(5));
  EXPECT_FALSE(r.IterationAbortSettled(6));
  f.header->sync_seq.fetch_add(1);
  EXPECT_TRUE(r.IterationAbortSettled(6));
  EXPECT_TRUE(r.SyncPending());

  absl::Status s = r.IterationAbortedError(6, "j");
  EXPECT_TRUE(IsIterationAborted(s)) << s;
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(s.message(), HasSubstr("iteration 6 of job 'j'"));
  EXPECT_THAT(s.message(), HasSubstr("local rank 1"));
  EXPECT_THAT(s.message(), HasSubstr("skip the optimizer step and retry the "
                                     "batch; the job goes on"));
  EXPECT_EQ(r.iterations_aborted(), 1u);
  // A plain ABORTED (the job failed) is not an aborted iteration.
  EXPECT_FALSE(IsIterationAborted(absl::AbortedError("job failed")));
}

TEST(RankRestartTest, AnAbortSeenBeforeTheSyncNeedsNoFurtherBump) {
  // A slow rank had not begun iteration 6 when rank 1 came back: it syncs
  // first (seeing the abort), then meets iteration 6 already done.
  Fixture f;
  RankRestart r;
  r.Attach(f.header.get(), false, 5000, 0);
  f.Reattach(1, 6, 0);
  ASSERT_TRUE(r.SyncPending());
  const RankRestart::SyncOffer o = r.Offer(0);
  ASSERT_TRUE(r.Agreed(o, o.values, "r0").ok());
  EXPECT_FALSE(r.SyncPending());
  EXPECT_TRUE(r.IterationAborted(6));
  EXPECT_TRUE(r.IterationAbortSettled(6));
}

TEST(RankRestartTest, AbortedRound) {
  Fixture f;
  RankRestart r;
  r.Attach(f.header.get(), false, 5000, 0);
  f.header->aborted_rank.store(2);
  f.header->aborted_round.store(9);
  EXPECT_TRUE(r.RoundAborted(9));
  EXPECT_FALSE(r.RoundAborted(8));
  EXPECT_FALSE(r.RoundAbortSettled(9));
  f.header->sync_seq.fetch_add(1);
  EXPECT_TRUE(r.RoundAbortSettled(9));
  absl::Status s = r.RoundAbortedError(9, "allreduce", "j");
  EXPECT_TRUE(IsIterationAborted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("allreduce (collective round 9)"));
  EXPECT_THAT(s.message(), HasSubstr("local rank 2"));
  EXPECT_EQ(r.iterations_aborted(), 0u);
}

// --- Node loss and arrival ("Re-formation", control block v6) -------------

TEST(RankRestartTest, ReformationJumpsSyncSeqAndNamesTheCause) {
  Fixture f;
  f.header->world_size.store(6);
  RankRestart r;
  r.Attach(f.header.get(), false, 0, 0);
  EXPECT_EQ(r.live_world_size(), 6);
  EXPECT_EQ(r.epoch(), 0u);
  // Another node had sync_seq 4: the agreed value is 5, a jump of 5 here.
  f.Reform(/*i=*/7, /*epoch=*/1, /*world=*/4, /*behind=*/false, /*agreed=*/5);
  EXPECT_TRUE(r.SyncPending());
  EXPECT_TRUE(r.IterationAborted(7));
  EXPECT_TRUE(r.IterationAbortSettled(7));
  EXPECT_EQ(r.live_world_size(), 4);
  EXPECT_EQ(r.epoch(), 1u);
  absl::Status s = r.IterationAbortedError(7, "j");
  EXPECT_TRUE(IsIterationAborted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("network re-formed"));
  EXPECT_THAT(s.message(), HasSubstr("epoch 1"));
  EXPECT_THAT(s.message(), HasSubstr("4 ranks taking part"));
  EXPECT_THAT(s.message(), Not(HasSubstr("local rank -1")));

  const RankRestart::SyncOffer o = r.Offer(2);
  EXPECT_EQ(o.values[0], 2);
  EXPECT_EQ(o.values[1], -5);
  ASSERT_TRUE(r.Agreed(o, o.values, "r2").ok());
  EXPECT_FALSE(r.SyncPending());
  // The next re-formation sets the next agreed value: pending again.
  f.Reform(9, 2, 6, false, 6);
  EXPECT_TRUE(r.SyncPending());
}

TEST(RankRestartTest, HandledFromALargerNodeDoesNotLeaveASyncPending) {
  // Node A's ranks read sync_seq 3, node B's 5 (before the re-formation
  // that aligns them reached A): the sync's MAX makes both handle 5. A's
  // own header then says 3 (or 4): nothing is pending there, and the
  // re-formation's agreed value (6) is above both.
  Fixture a_node, b_node;
  a_node.header->sync_seq.store(3);
  b_node.header->sync_seq.store(5);
  RankRestart a, b;
  a.Attach(a_node.header.get(), false, 0, 3);
  b.Attach(b_node.header.get(), false, 0, 4);
  ASSERT_TRUE(b.SyncPending());
  const RankRestart::SyncOffer oa = a.Offer(0);
  const RankRestart::SyncOffer ob = b.Offer(1);
  int64_t reduced[RankRestart::kSyncValues];
  Fixture::Reduce(oa, ob, reduced);
  ASSERT_TRUE(a.Agreed(oa, reduced, "a").ok());
  ASSERT_TRUE(b.Agreed(ob, reduced, "b").ok());
  EXPECT_FALSE(a.SyncPending());
  EXPECT_FALSE(b.SyncPending());
  a_node.header->sync_seq.store(4);
  EXPECT_FALSE(a.SyncPending());
  a_node.Reform(0, 1, 2, false, 6);
  b_node.Reform(0, 1, 2, false, 6);
  EXPECT_TRUE(a.SyncPending());
  EXPECT_TRUE(b.SyncPending());
}

TEST(RankRestartTest, StateBehindOffersNoStateUntilSyncedInThatEpoch) {
  Fixture f;
  RankRestart r;
  r.Attach(f.header.get(), false, 0, 0);
  EXPECT_FALSE(r.StateBehind());
  // This node's last iteration failed on the network while it completed
  // on the others: it holds no state in this sync.
  f.Reform(0, 1, 4, /*behind=*/true, 3);
  EXPECT_TRUE(r.StateBehind());
  ASSERT_TRUE(r.SyncPending());
  const RankRestart::SyncOffer o = r.Offer(0);
  EXPECT_EQ(o.values[0], INT32_MAX);
  // A live rank on another node (global rank 2) holds it.
  int64_t reduced[RankRestart::kSyncValues] = {2, o.values[1]};
  absl::StatusOr<int> root = r.Agreed(o, reduced, "r0");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(*root, 2);
  // Until it hands over a gradient (the broadcast may still be cut short)
  // it keeps offering none.
  EXPECT_TRUE(r.StateBehind());
  EXPECT_EQ(r.Offer(0).values[0], INT32_MAX);
  r.NoteMarkReady();
  EXPECT_FALSE(r.StateBehind());
  EXPECT_EQ(r.Offer(0).values[0], 0);
  EXPECT_FALSE(r.SyncPending());
  // A later re-formation that finds the node behind again counts again.
  f.Reform(0, 2, 4, true, 4);
  EXPECT_TRUE(r.StateBehind());
  EXPECT_EQ(r.Offer(0).values[0], INT32_MAX);
  // One that does not: the rank offers its state.
  f.Reform(0, 3, 4, false, 5);
  EXPECT_FALSE(r.StateBehind());
  EXPECT_EQ(r.Offer(0).values[0], 0);
}

TEST(RankRestartTest, EveryRankBehindIsAnError) {
  // Only behind nodes are left: nobody holds the state.
  Fixture f;
  RankRestart r;
  r.Attach(f.header.get(), false, 0, 0);
  f.Reform(0, 1, 2, true, 2);
  const RankRestart::SyncOffer o = r.Offer(0);
  absl::StatusOr<int> root = r.Agreed(o, o.values, "job 'j', local rank 0");
  EXPECT_EQ(root.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace gradd
