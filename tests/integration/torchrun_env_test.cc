// Multi-node jobs launched the way torchrun launches them: two real gradd
// daemons (one per "node") configured with nothing but their node id and a
// free rendezvous port (the default, 29600, on real machines), and trainer
// processes that get only torchrun's environment variables (RANK,
// LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
// ROLE_*, MASTER_ADDR, MASTER_PORT) plus GRADD_SOCKET, which on one machine
// stands for "the daemon of my node". No coordinator is configured: the
// daemon on MASTER_ADDR's host serves the rendezvous on demand. Every
// averaged value is checked exactly, for the C++ and the C client; a world
// size that disagrees with what the daemons formed is an error naming both.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "tests/support/temp_dir.h"

namespace gradd::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

long Field(const std::string& output, const std::string& key) {
  size_t at = output.find(key + "=");
  if (at == std::string::npos) return -1;
  return std::strtol(output.c_str() + at + key.size() + 1, nullptr, 10);
}

class TorchrunEnvTest : public GraddTest {
 protected:
  void SetUp() override {
    dir_ = ::gradd::testing::MakeTempDir("gradd-tr-");
    ASSERT_FALSE(dir_.empty());
    port_ = FreePort();
    ASSERT_GT(port_, 0);
  }

  void TearDown() override {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].pid <= 0) continue;
      kill(nodes_[i].pid, SIGTERM);
      Exit e = Wait(nodes_[i], milliseconds(10000));
      EXPECT_EQ(e.code, 0) << "node " << i << " did not exit cleanly";
      if (HasFailure()) std::cerr << "---- node " << i << " ----\n" << e.output;
    }
    GraddTest::TearDown();
  }

  std::string Socket(int node) {
    return absl::StrCat(dir_, "/node", node, "/gradd.sock");
  }

  // Daemons for nodes 0..n-1: node id and rendezvous port only.
  bool StartNodes(int n) {
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> argv = {GRADD_DAEMON_BINARY,
                                       "--socket",
                                       Socket(i),
                                       "--node-id",
                                       absl::StrCat("host", i),
                                       "--rendezvous-port",
                                       absl::StrCat(port_)};
      const std::vector<std::string> auth = NodeAuthFlags();
      argv.insert(argv.end(), auth.begin(), auth.end());
      Proc p = Spawn(absl::StrCat("gradd-node", i), argv);
      procs_.pop_back();  // stopped by TearDown with SIGTERM
      nodes_.push_back(p);
    }
    for (int i = 0; i < n; ++i) {
      const auto deadline = Clock::now() + milliseconds(10000);
      struct stat st;
      while (stat((Socket(i) + ".session").c_str(), &st) != 0) {
        if (Clock::now() > deadline) {
          ADD_FAILURE() << "node " << i << " did not come up:\n"
                        << ReadFile(nodes_[i].log);
          return false;
        }
        std::this_thread::sleep_for(milliseconds(10));
      }
    }
    return true;
  }

  // What torchrun --nnodes N --nproc_per_node L gives global rank `rank`.
  std::vector<std::string> TorchrunEnv(int rank, int nodes, int local) {
    const int node = rank / local;
    return {absl::StrCat("RANK=", rank),
            absl::StrCat("LOCAL_RANK=", rank % local),
            absl::StrCat("WORLD_SIZE=", nodes * local),
            absl::StrCat("LOCAL_WORLD_SIZE=", local),
            absl::StrCat("GROUP_RANK=", node),
            absl::StrCat("GROUP_WORLD_SIZE=", nodes),
            absl::StrCat("ROLE_RANK=", rank),
            absl::StrCat("ROLE_WORLD_SIZE=", nodes * local),
            "ROLE_NAME=default", "MASTER_ADDR=127.0.0.1",
            // torchrun's store, which gradd must not use.
            absl::StrCat("MASTER_PORT=", port_ == 65535 ? 65534 : port_ + 1),
            "TORCHELASTIC_RUN_ID=none",
            absl::StrCat("GRADD_SOCKET=", Socket(node))};
  }

  int port_ = 0;
  std::vector<Proc> nodes_;
};

TEST_F(TorchrunEnvTest, TwoNodesTimesTwoTrainersFormOneJobAndAverageExactly) {
  ASSERT_TRUE(StartNodes(2));
  std::vector<Proc> ps;
  for (int rank = 0; rank < 4; ++rank) {
    // No --socket, --local-rank, --local-world-size, --num-nodes: all from
    // the environment.
    ps.push_back(Spawn(absl::StrCat("cxx.rank", rank),
                       {GRADD_TEST_TRAINER, "--job", "tr", "--iterations", "20",
                        "--seed", "3", "--bucket-cap-mb", "0.01"},
                       TorchrunEnv(rank, 2, 2)));
  }
  std::vector<Exit> exits = WaitAll(ps, milliseconds(60000));
  std::set<long> ranks;
  for (size_t i = 0; i < exits.size(); ++i) {
    ASSERT_EQ(exits[i].code, 0) << ps[i].name << ":\n" << exits[i].output;
    EXPECT_THAT(exits[i].output, HasSubstr("PASS iterations=20"));
    EXPECT_EQ(Field(exits[i].output, "world"), 4);
    EXPECT_GT(Field(exits[i].output, "verified"), 0);
    // GROUP_RANK decides the node rank, so RANK is the global rank.
    EXPECT_EQ(Field(exits[i].output, "rank"), static_cast<long>(i));
    ranks.insert(Field(exits[i].output, "rank"));
  }
  EXPECT_EQ(ranks, (std::set<long>{0, 1, 2, 3}));
  // Exactly one of the two daemons served the rendezvous.
  int serving = 0;
  for (const Proc& n : nodes_) {
    serving +=
        ReadFile(n.log).find("coordinator store on") != std::string::npos;
  }
  EXPECT_EQ(serving, 1);
}

TEST_F(TorchrunEnvTest, CClientUnderTorchrunEnvironment) {
  ASSERT_TRUE(StartNodes(2));
  std::vector<Proc> ps;
  for (int rank = 0; rank < 4; ++rank) {
    ps.push_back(Spawn(absl::StrCat("c.rank", rank),
                       {GRADD_C_TRAINER, "torchrun", "ctr", "10"},
                       TorchrunEnv(rank, 2, 2)));
  }
  std::vector<Exit> exits = WaitAll(ps, milliseconds(60000));
  for (size_t i = 0; i < exits.size(); ++i) {
    ASSERT_EQ(exits[i].code, 0) << ps[i].name << ":\n" << exits[i].output;
    EXPECT_THAT(exits[i].output,
                AllOf(HasSubstr("PASS iterations=10"),
                      HasSubstr(absl::StrCat("rank=", i, " world=4"))));
  }
}

TEST_F(TorchrunEnvTest, AWorldSizeTheDaemonsDidNotFormIsAnErrorNamingBoth) {
  ASSERT_TRUE(StartNodes(1));
  std::vector<Proc> ps;
  for (int rank = 0; rank < 2; ++rank) {
    // The trainers insist on one node while torchrun says two: the daemon
    // forms a 2-rank job, which must not pass for the 4-rank one.
    ps.push_back(Spawn(absl::StrCat("one.rank", rank),
                       {GRADD_TEST_TRAINER, "--job", "one", "--num-nodes", "1",
                        "--iterations", "2"},
                       TorchrunEnv(rank, 2, 2)));
  }
  std::vector<Exit> exits = WaitAll(ps, milliseconds(30000));
  for (size_t i = 0; i < exits.size(); ++i) {
    EXPECT_EQ(exits[i].code, 3) << ps[i].name << ":\n" << exits[i].output;
    EXPECT_THAT(exits[i].output,
                AllOf(HasSubstr("ERROR code=9"), HasSubstr("world size 4"),
                      HasSubstr("world size 2")))
        << ps[i].name;
  }
}

}  // namespace
}  // namespace gradd::testing
