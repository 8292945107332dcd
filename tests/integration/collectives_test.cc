// Collectives of arbitrary data through real daemons (issue 19): real
// trainer processes (collective_trainer.cc, through the C ABI) run
// allreduce of every op and dtype class, allgather, reduce_scatter,
// broadcast and barrier, sized to need several rounds through a small
// collective area, and check every value against its closed form: 2 and 3
// local ranks on one daemon, a collective-only job with the default area,
// a job with gradients in between, two daemons on loopback with uneven
// local worlds, and mismatched calls (one daemon and across daemons) that
// fail the job with a clear error while the daemon keeps serving.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace gradd::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class CollectivesTest : public GraddTest {
 protected:
  Proc Trainer(const std::string& socket, const std::string& job, int rank,
               int world, const std::vector<std::string>& extra) {
    return SpawnTrainerBinary(
        GRADD_COLLECTIVE_TRAINER, socket,
        absl::StrCat(job, ".", procs_.size(), ".rank", rank), job, rank, world,
        extra);
  }

  // `world` trainers of `job` on the test's daemon; their exits.
  std::vector<Exit> RunLocal(const std::string& job, int world,
                             const std::vector<std::string>& extra) {
    std::vector<Proc> ps;
    for (int r = 0; r < world; ++r) {
      ps.push_back(Trainer(socket_, job, r, world, extra));
    }
    return WaitAll(ps, milliseconds(60000));
  }

  // Every rank passed all `checks` checks (collective_trainer.cc: 40, one
  // more with --params).
  void ExpectPass(const std::vector<Exit>& exits, int world, int checks = 40) {
    ASSERT_EQ(exits.size(), static_cast<size_t>(world));
    std::set<std::string> ranks;
    for (size_t r = 0; r < exits.size(); ++r) {
      EXPECT_EQ(exits[r].code, 0) << "rank " << r << ":\n" << exits[r].output;
      EXPECT_THAT(exits[r].output,
                  HasSubstr(absl::StrCat("world=", world, " checks=", checks)))
          << exits[r].output;
      ranks.insert(ReportedValue(exits[r].output, "rank"));
    }
    EXPECT_EQ(ranks.size(), static_cast<size_t>(world)) << "duplicate ranks";
  }
};

TEST_F(CollectivesTest, TwoLocalRanksEveryOpAndDtypeInSeveralRounds) {
  // 3001 elements through a 4096-byte area: allreduce of float64 takes 6
  // rounds, allgather 2 x 3001 bytes 2 x 2048-byte blocks, ...
  ExpectPass(RunLocal("two", 2, {"--collective-bytes", "4096"}), 2);
}

TEST_F(CollectivesTest, ThreeLocalRanksWithGradientIterationsInBetween) {
  ExpectPass(RunLocal("three", 3,
                      {"--collective-bytes", "1000", "--count", "1234",
                       "--params", "2"}),
             3, 41);
}

TEST_F(CollectivesTest, CollectiveOnlyJobGetsTheDefaultArea) {
  // No parameters and collective_bytes 0: the 4 MiB default, one round.
  ExpectPass(
      RunLocal("default", 2, {"--collective-bytes", "0", "--count", "20000"}),
      2);
  // Its end says what it ran (issue 32: not "0 buckets reduced").
  EXPECT_TRUE(
      WaitForText(daemon_, "job 'default' ended: ", milliseconds(10000)))
      << ReadFile(daemon_.log);
  EXPECT_THAT(ReadFile(daemon_.log),
              HasSubstr("collective round(s), no gradient buckets"));
}

TEST_F(CollectivesTest, MismatchedOpFailsTheJobNamingBothRanks) {
  std::vector<Exit> exits = RunLocal("mm", 2, {"--mode", "mismatch_op"});
  ASSERT_EQ(exits.size(), 2u);
  for (const Exit& e : exits) {
    EXPECT_EQ(e.code, 3) << e.output;
    EXPECT_THAT(e.output,
                AllOf(HasSubstr("code=3"), HasSubstr("job 'mm'"),
                      HasSubstr("local rank 0 (global rank 0) issued "
                                "allreduce (float32, sum, 4096 bytes)"),
                      HasSubstr("local rank 1 (global rank 1) issued "
                                "allreduce (float32, max, 4096 bytes)")))
        << e.output;
  }
  ExpectHealthyJob("after_mismatch");
  ExpectPass(RunLocal("after_mismatch_coll", 2, {}), 2);
}

TEST_F(CollectivesTest, MismatchedSizeFailsTheJob) {
  std::vector<Exit> exits =
      RunLocal("ms", 2, {"--mode", "mismatch_size", "--count", "5"});
  ASSERT_EQ(exits.size(), 2u);
  for (const Exit& e : exits) {
    EXPECT_EQ(e.code, 3) << e.output;
    EXPECT_THAT(e.output, AllOf(HasSubstr("code=3"), HasSubstr("20 bytes"),
                                HasSubstr("16 bytes")))
        << e.output;
  }
  ExpectHealthyJob("after_size");
}

TEST_F(CollectivesTest, TwoDaemonsUnevenLocalWorlds) {
  const std::vector<std::string> sockets = StartNodeDaemons(2);
  ASSERT_EQ(sockets.size(), 2u);
  // Node 0: global ranks 0-1; node 1: rank 2.
  std::vector<Proc> ps;
  const std::vector<std::string> flags = {
      "--num-nodes", "2", "--collective-bytes", "3000", "--count", "2500"};
  ps.push_back(Trainer(sockets[0], "mn", 0, 2, flags));
  ps.push_back(Trainer(sockets[0], "mn", 1, 2, flags));
  ps.push_back(Trainer(sockets[1], "mn", 0, 1, flags));
  ExpectPass(WaitAll(ps, milliseconds(80000)), 3);
}

TEST_F(CollectivesTest, NodesThatDisagreeFailEveryRank) {
  const std::vector<std::string> sockets = StartNodeDaemons(2);
  ASSERT_EQ(sockets.size(), 2u);
  // One rank per node: only the daemons can see that global rank 1 asks
  // for max where rank 0 sums.
  std::vector<Proc> ps;
  const std::vector<std::string> flags = {"--num-nodes", "2", "--mode",
                                          "mismatch_op"};
  ps.push_back(Trainer(sockets[0], "mnx", 0, 1, flags));
  ps.push_back(Trainer(sockets[1], "mnx", 0, 1, flags));
  std::vector<Exit> exits = WaitAll(ps, milliseconds(60000));
  for (const Exit& e : exits) {
    EXPECT_EQ(e.code, 3) << e.output;
    EXPECT_THAT(e.output, AllOf(HasSubstr("the nodes disagree on collective "
                                          "round 1"),
                                HasSubstr("op ranges over 0..3")))
        << e.output;
  }
}

}  // namespace
}  // namespace gradd::testing
