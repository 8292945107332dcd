// The launcher's environment as ClientOptions
// (client/src/session/launcher_env.h): torchrun's variables for 2 nodes x 2
// trainers give a 2-node job, never two single-node ones; contradictions and a
// formed world that differs from the launcher's are errors naming both numbers.
#include "client/src/session/launcher_env.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd::internal {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) {
    auto it = vars.find(name);
    return it == vars.end() ? std::string() : it->second;
  };
}

// What torchrun --nnodes 2 --nproc_per_node 2 gives global rank 3.
std::map<std::string, std::string> TorchrunRank3() {
  return {{"RANK", "3"},
          {"LOCAL_RANK", "1"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"GROUP_RANK", "1"},
          {"GROUP_WORLD_SIZE", "2"},
          {"ROLE_WORLD_SIZE", "4"},
          {"MASTER_ADDR", "node-a"},
          {"MASTER_PORT", "29500"}};
}

TEST(LauncherEnvTest, TorchrunTwoNodesFillsEveryField) {
  ClientOptions o;
  ASSERT_TRUE(ApplyLauncherEnv(&o, Env(TorchrunRank3())).ok());
  EXPECT_EQ(o.local_rank, 1);
  EXPECT_EQ(o.local_world_size, 2);
  EXPECT_EQ(o.num_nodes, 2);
  ASSERT_TRUE(o.node_rank.has_value());
  EXPECT_EQ(*o.node_rank, 1);
  EXPECT_EQ(o.world_size, 4);
  ASSERT_TRUE(o.rank.has_value());
  EXPECT_EQ(*o.rank, 3);
  // The host only: MASTER_PORT is torch's store, not gradd's rendezvous.
  EXPECT_EQ(o.coordinator, "node-a");
}

TEST(LauncherEnvTest, WorldOverLocalWorldGivesNodesWithoutGroupWorldSize) {
  std::map<std::string, std::string> vars = TorchrunRank3();
  vars.erase("GROUP_WORLD_SIZE");
  ClientOptions o;
  ASSERT_TRUE(ApplyLauncherEnv(&o, Env(vars)).ok());
  EXPECT_EQ(o.num_nodes, 2);
}

TEST(LauncherEnvTest, ExplicitOptionsWinOverTheEnvironment) {
  ClientOptions o;
  o.local_rank = 0;
  o.local_world_size = 4;
  o.num_nodes = 1;
  o.coordinator = "other:1234";
  std::map<std::string, std::string> vars = TorchrunRank3();
  vars.erase("GROUP_WORLD_SIZE");
  ASSERT_TRUE(ApplyLauncherEnv(&o, Env(vars)).ok());
  EXPECT_EQ(o.local_rank, 0);
  EXPECT_EQ(o.local_world_size, 4);
  EXPECT_EQ(o.num_nodes, 1);
  EXPECT_FALSE(o.node_rank.has_value());  // single node: GROUP_RANK ignored
  EXPECT_EQ(o.coordinator, "other:1234");
}

TEST(LauncherEnvTest, GraddVariablesComeFirst) {
  std::map<std::string, std::string> vars = TorchrunRank3();
  vars["GRADD_NODE_RANK"] = "0";
  vars["GRADD_COORDINATOR"] = "coord:7000";
  vars["GRADD_NODE_ID"] = "n7";
  ClientOptions o;
  ASSERT_TRUE(ApplyLauncherEnv(&o, Env(vars)).ok());
  EXPECT_EQ(*o.node_rank, 0);
  EXPECT_EQ(o.coordinator, "coord:7000");
  EXPECT_EQ(o.node_id, "n7");
}

TEST(LauncherEnvTest, NoEnvironmentIsOneRankOnOneNode) {
  ClientOptions o;
  ASSERT_TRUE(ApplyLauncherEnv(&o, Env({})).ok());
  EXPECT_EQ(o.local_rank, 0);
  EXPECT_EQ(o.local_world_size, 1);
  EXPECT_LE(o.num_nodes, 1);
  EXPECT_EQ(o.world_size, 0);
  EXPECT_FALSE(o.rank.has_value());
  EXPECT_EQ(o.coordinator, "");
}

TEST(LauncherEnvTest, ContradictionsNameBothNumbers) {
  std::map<std::string, std::string> vars = TorchrunRank3();
  vars["GROUP_WORLD_SIZE"] = "3";
  ClientOptions o;
  absl::Status s = ApplyLauncherEnv(&o, Env(vars));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("GROUP_WORLD_SIZE=3"),
                                 HasSubstr("WORLD_SIZE=4")));

  vars = TorchrunRank3();
  vars.erase("GROUP_WORLD_SIZE");
  vars["WORLD_SIZE"] = "5";
  ClientOptions o2;
  s = ApplyLauncherEnv(&o2, Env(vars));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("WORLD_SIZE=5"),
                                 HasSubstr("local world size 2")));
}

TEST(LauncherEnvTest, NonNumbersAreNamed) {
  std::map<std::string, std::string> vars = TorchrunRank3();
  vars["LOCAL_WORLD_SIZE"] = "two";
  ClientOptions o;
  absl::Status s = ApplyLauncherEnv(&o, Env(vars));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("LOCAL_WORLD_SIZE='two'"));
}

TEST(LauncherEnvTest, FormedWorldMustMatchTheLaunchersWorld) {
  ClientOptions o;
  o.job_id = "j";
  o.local_world_size = 2;
  o.world_size = 4;
  o.rank = 3;
  EXPECT_TRUE(CheckFormedWorld(o, 4, 3).ok());
  absl::Status s = CheckFormedWorld(o, 2, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("world size 4"), HasSubstr("world size 2"),
                    HasSubstr("job 'j'")));
  s = CheckFormedWorld(o, 4, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("rank 3"), HasSubstr("rank 1")));
  ClientOptions unchecked;
  EXPECT_TRUE(CheckFormedWorld(unchecked, 2, 1).ok());
}

}  // namespace
}  // namespace gradd::internal
