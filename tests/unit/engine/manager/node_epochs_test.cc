// NodeEpochs (server/engine/manager/node_epochs.h) driven by hand: the
// epochs a re-formable job goes through on this node, arrivals filtered
// while a re-formation runs or once one settled them, the verdict adopted,
// and the stall that fails the job instead of re-forming forever.
#include "server/engine/manager/node_epochs.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

std::vector<JobNode> Nodes(const std::vector<std::string>& ids) {
  std::vector<JobNode> nodes;
  for (size_t i = 0; i < ids.size(); ++i) {
    nodes.push_back({ids[i], static_cast<int>(i), 2, static_cast<int>(2 * i)});
  }
  return nodes;
}

JobLayout Layout(const std::vector<std::string>& ids, int node_rank) {
  JobLayout layout;
  layout.nodes = Nodes(ids);
  layout.node_rank = node_rank;
  layout.num_nodes = static_cast<int>(ids.size());
  layout.world_size = 2 * layout.num_nodes;
  layout.global_rank_offset = 2 * node_rank;
  return layout;
}

TEST(NodeEpochsTest, StartsRunningAtItsEpochWithItsMembers) {
  NodeEpochs e(Nodes({"a", "b", "c"}), 1, 3, /*arrivals_seen=*/0,
               /*epoch=*/4);
  EXPECT_FALSE(e.reforming());
  EXPECT_EQ(e.epoch(), 4u);
  EXPECT_EQ(e.self().node_id, "b");
  EXPECT_EQ(e.self().global_rank_offset, 2);
  EXPECT_EQ(e.members().size(), 3u);
  EXPECT_EQ(e.watch().next_arrival->load(), 1);
  EXPECT_EQ(e.watch().reformations->load(), 0u);
}

TEST(NodeEpochsTest, MinNodesIsTheJobsOrAllOfThem) {
  NodeEpochs e(Nodes({"a", "b", "c"}), 0, 3, 0, 0);
  EXPECT_EQ(e.min_nodes(2), 2);
  // Re-formable through its rank restart grace only: a lost node fails it.
  EXPECT_EQ(e.min_nodes(0), 3);
}

TEST(NodeEpochsTest, AnArrivalBreaksOnlyWhileRunningAndUnsettled) {
  NodeEpochs e(Nodes({"a", "b"}), 0, 3, /*arrivals_seen=*/2, 0);
  // Arrivals 1 and 2 were there when the job formed.
  EXPECT_FALSE(e.BreaksFor(1));
  EXPECT_FALSE(e.BreaksFor(2));
  EXPECT_TRUE(e.BreaksFor(3));
  e.Begin();
  EXPECT_TRUE(e.reforming());
  EXPECT_FALSE(e.BreaksFor(3)) << "the running re-formation admits it";
  // It did: the verdict took arrival 3.
  ASSERT_TRUE(e.Adopt("job", Layout({"a", "b", "n"}, 0), 1,
                      /*max_completed=*/10, /*arrivals_seen=*/3, "arrival")
                  .ok());
  EXPECT_FALSE(e.reforming());
  EXPECT_FALSE(e.BreaksFor(3)) << "settled by the re-formation";
  EXPECT_TRUE(e.BreaksFor(4));
}

TEST(NodeEpochsTest, AnArrivalTooLateForTheEpochBreaksAgainAfterIt) {
  NodeEpochs e(Nodes({"a", "b"}), 0, 3, 0, 0);
  e.Begin();
  EXPECT_FALSE(e.BreaksFor(1));
  // The verdict closed without it (arrivals_seen 0).
  ASSERT_TRUE(
      e.Adopt("job", Layout({"a", "b"}, 0), 1, 10, 0, "node lost").ok());
  EXPECT_TRUE(e.BreaksFor(1));
  // The watcher counts re-formations to know it may post it again.
  EXPECT_EQ(e.watch().reformations->load(), 1u);
}

TEST(NodeEpochsTest, AdoptTakesTheNewMembershipAndEpoch) {
  NodeEpochs e(Nodes({"a", "b", "c"}), 2, 3, 0, 0);
  e.Begin();
  // Node "a" was lost: "c" is node rank 1 of 2 now.
  ASSERT_TRUE(e.Adopt("job", Layout({"b", "c"}, 1), 1, 5, 0, "lost").ok());
  EXPECT_EQ(e.epoch(), 1u);
  EXPECT_EQ(e.node_rank(), 1);
  EXPECT_EQ(e.self().node_id, "c");
  ASSERT_EQ(e.members().size(), 2u);
  EXPECT_EQ(e.members()[0].node_id, "b");
  EXPECT_EQ(e.max_nodes(), 3) << "arrivals are still admitted up to 3";
}

TEST(NodeEpochsTest, NextArrivalNeverGoesBack) {
  NodeEpochs e(Nodes({"a", "b"}), 0, 4, /*arrivals_seen=*/5, 0);
  e.Begin();
  // A verdict that saw fewer arrivals than this node had seen.
  ASSERT_TRUE(e.Adopt("job", Layout({"a", "b"}, 0), 1, 3, 2, "lost").ok());
  EXPECT_EQ(e.watch().next_arrival->load(), 6);
}

TEST(NodeEpochsTest, EndWithoutVerdictKeepsTheEpoch) {
  NodeEpochs e(Nodes({"a", "b"}), 0, 2, 0, 7);
  e.Begin();
  e.End();
  EXPECT_FALSE(e.reforming());
  EXPECT_EQ(e.epoch(), 7u);
  EXPECT_EQ(e.watch().reformations->load(), 0u);
}

TEST(NodeEpochsTest, ReformingWithoutProgressFailsAfterTheLimit) {
  NodeEpochs e(Nodes({"a", "b"}), 0, 2, 0, 0);
  for (int i = 1; i < ReformationStall::kMaxInARow; ++i) {
    e.Begin();
    ASSERT_TRUE(e.Adopt("job", Layout({"a", "b"}, 0), i, /*max_completed=*/9, 0,
                        "flapping link")
                    .ok())
        << i;
  }
  e.Begin();
  absl::Status stalled =
      e.Adopt("job", Layout({"a", "b"}, 0), ReformationStall::kMaxInARow, 9, 0,
              "flapping link");
  EXPECT_TRUE(absl::IsAborted(stalled)) << stalled;
  EXPECT_THAT(stalled.message(), HasSubstr("job 'job'"));
  EXPECT_THAT(stalled.message(), HasSubstr("re-formed 8 times in a row"));
  EXPECT_THAT(stalled.message(), HasSubstr("last cause: flapping link"));
  // Nothing adopted from the stalled verdict.
  EXPECT_EQ(e.epoch(), static_cast<uint64_t>(ReformationStall::kMaxInARow - 1));
  EXPECT_FALSE(e.reforming());
}

TEST(NodeEpochsTest, ProgressBetweenReformationsStartsTheCountAgain) {
  NodeEpochs e(Nodes({"a", "b"}), 0, 2, 0, 0);
  for (int i = 1; i <= 3 * ReformationStall::kMaxInARow; ++i) {
    e.Begin();
    // Every other re-formation follows a completed iteration.
    ASSERT_TRUE(e.Adopt("job", Layout({"a", "b"}, 0), i,
                        /*max_completed=*/static_cast<uint64_t>(i / 2), 0,
                        "arrival")
                    .ok())
        << i;
  }
  EXPECT_EQ(e.epoch(), static_cast<uint64_t>(3 * ReformationStall::kMaxInARow));
}

}  // namespace
}  // namespace gradd
