// Bucket rebuild with the real gradd and real trainer processes
// (test_trainer --rebuild-after): the plan changes to one made from local
// rank 0's ready order, every value stays exactly right across the switch
// (moved gradients and the iterations after it), and a rank that skips
// the rebuild fails the job with a clear error instead of a hang.
#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "tests/support/temp_dir.h"

namespace gradd::testing {
namespace {

using ::testing::HasSubstr;

class RebuildIntegrationTest : public GraddTest {};

TEST_F(RebuildIntegrationTest, TwoTrainersRebuildAfterTheFirstIteration) {
  std::vector<Exit> exits =
      RunJob("rebuild2", 2,
             {"--iterations", "6", "--seed", "4242", "--rebuild-after", "1",
              "--bucket-cap-mb", "0.01", "--first-bucket-cap-mb", "0.002"},
             milliseconds(60000));
  ASSERT_EQ(exits.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(exits[r].code, 0) << "rank " << r << ":\n" << exits[r].output;
    EXPECT_THAT(exits[r].output, HasSubstr("PASS iterations=6"));
    EXPECT_THAT(exits[r].output, HasSubstr("REBUILT"));
  }
  const std::string plan = ReportedValue(exits[0].output, "plan");
  const std::string before = ReportedValue(exits[0].output, "before");
  ASSERT_FALSE(plan.empty());
  // Every rank switched to the same plan, and it is a different one.
  EXPECT_EQ(ReportedValue(exits[1].output, "plan"), plan);
  EXPECT_NE(plan, before);

  // The plan comes from local rank 0's ready order (the ranks' random
  // orders differ): inside every bucket, parameters follow it.
  const std::vector<int> order0 =
      ReportedInts(ReportedValue(exits[0].output, "order"));
  const std::vector<int> order1 =
      ReportedInts(ReportedValue(exits[1].output, "order"));
  ASSERT_EQ(order0.size(), 24u);
  EXPECT_NE(order0, order1);
  EXPECT_GE(ExpectBucketsFollow(plan, order0, "local rank 0's"), 5);
}

TEST_F(RebuildIntegrationTest, ARankThatSkipsTheRebuildFailsTheJob) {
  std::vector<Exit> exits =
      RunJob("skip", 2,
             {"--iterations", "4", "--seed", "5", "--rebuild-after", "1",
              "--mode", "skip_rebuild", "--wait-timeout-ms", "20000"},
             milliseconds(40000));
  ASSERT_EQ(exits.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(exits[r].code, 3) << "rank " << r << ":\n" << exits[r].output;
    EXPECT_THAT(exits[r].output,
                HasSubstr("local rank 1 of job 'skip' started iteration 2 "
                          "without rebuilding buckets"))
        << "rank " << r;
  }
  ExpectHealthyJob("after-skip");
}

// Two daemons on loopback (node-a hosts the rendezvous coordinator) instead
// of GraddTest's one; each test's trainers attach to either.
class RebuildTwoDaemonsTest : public GraddTest {
 protected:
  void SetUp() override {
    dir_ = ::gradd::testing::MakeTempDir("gradd-rb-");
    ASSERT_FALSE(dir_.empty());
    ASSERT_TRUE(StartNode("node-a"));
    ASSERT_TRUE(StartNode("node-b"));
  }
  void TearDown() override {
    for (Proc& d : nodes_) {
      if (d.pid <= 0) continue;
      kill(d.pid, SIGTERM);
      Exit e = Wait(d, milliseconds(10000));
      EXPECT_EQ(e.code, 0) << d.name << " did not exit cleanly:\n" << e.output;
    }
    if (HasFailure()) {
      for (const Proc& d : nodes_) {
        std::cerr << "---- " << d.name << " log ----\n" << ReadFile(d.log);
      }
    }
    GraddTest::TearDown();
  }
  std::string SocketOf(const std::string& id) const {
    return absl::StrCat(dir_, "/", id, "/gradd.sock");
  }
  bool StartNode(const std::string& id) {
    std::vector<std::string> argv = {GRADD_DAEMON_BINARY, "--socket",
                                     SocketOf(id), "--node-id", id};
    const std::vector<std::string> auth = NodeAuthFlags();
    argv.insert(argv.end(), auth.begin(), auth.end());
    const std::string port_file = dir_ + "/coordinator.port";
    if (coordinator_.empty()) {
      argv.insert(argv.end(), {"--rendezvous-listen", "127.0.0.1:0",
                               "--rendezvous-port-file", port_file});
    } else {
      argv.insert(argv.end(), {"--coordinator", coordinator_});
    }
    nodes_.push_back(Spawn(absl::StrCat("gradd-", id), argv));
    procs_.pop_back();  // stopped with SIGTERM in TearDown, not SIGKILLed
    const auto deadline =
        std::chrono::steady_clock::now() + milliseconds(10000);
    struct stat st;
    while (std::chrono::steady_clock::now() < deadline) {
      const bool up = stat(SocketOf(id).c_str(), &st) == 0 &&
                      stat((SocketOf(id) + ".session").c_str(), &st) == 0;
      if (up && coordinator_.empty()) {
        int port = 0;
        if (absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(port_file)),
                             &port) &&
            port > 0) {
          coordinator_ = absl::StrCat("127.0.0.1:", port);
        }
      }
      if (up && !coordinator_.empty()) return true;
      std::this_thread::sleep_for(milliseconds(10));
    }
    ADD_FAILURE() << "gradd " << id << " did not come up:\n"
                  << ReadFile(nodes_.back().log);
    return false;
  }

  std::vector<Proc> nodes_;
  std::string coordinator_;
};

// Every trainer marks its parameters in its own random order; the plan all
// four switch to comes from global rank 0's (node rank 0, local rank 0).
TEST_F(RebuildTwoDaemonsTest, NodeRankZerosOrderWinsAndValuesStayExact) {
  std::vector<Proc> ps;
  for (const std::string id : {"node-a", "node-b"}) {
    for (int r = 0; r < 2; ++r) {
      ps.push_back(Spawn(absl::StrCat("mn-rebuild.", id, ".rank", r),
                         {GRADD_TEST_TRAINER,
                          "--socket",
                          SocketOf(id),
                          "--job",
                          "mn-rebuild",
                          "--local-rank",
                          absl::StrCat(r),
                          "--local-world-size",
                          "2",
                          "--num-nodes",
                          "2",
                          "--iterations",
                          "6",
                          "--seed",
                          "31",
                          "--rebuild-after",
                          "1",
                          "--bucket-cap-mb",
                          "0.01",
                          "--first-bucket-cap-mb",
                          "0.002"}));
    }
  }
  std::vector<Exit> exits = WaitAll(ps, milliseconds(60000));
  ASSERT_EQ(exits.size(), 4u);
  std::string rank0_output;
  for (size_t i = 0; i < exits.size(); ++i) {
    ASSERT_EQ(exits[i].code, 0) << ps[i].name << ":\n" << exits[i].output;
    EXPECT_THAT(exits[i].output, HasSubstr("PASS iterations=6"));
    EXPECT_THAT(exits[i].output, HasSubstr("world=4"));
    if (exits[i].output.find("rank=0 ") != std::string::npos) {
      rank0_output = exits[i].output;
    }
  }
  ASSERT_FALSE(rank0_output.empty());
  const std::string plan = ReportedValue(rank0_output, "plan");
  const std::vector<int> order0 =
      ReportedInts(ReportedValue(rank0_output, "order"));
  ASSERT_EQ(order0.size(), 24u);
  int other_orders = 0;
  for (const Exit& e : exits) {
    other_orders += ReportedInts(ReportedValue(e.output, "order")) != order0;
    EXPECT_EQ(ReportedValue(e.output, "plan"), plan)
        << "nodes switched to different plans";
  }
  EXPECT_EQ(other_orders, 3) << "the trainers' ready orders must differ";
  ExpectBucketsFollow(plan, order0, "global rank 0's");
}

}  // namespace
}  // namespace gradd::testing
