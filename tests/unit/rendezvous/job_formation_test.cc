// FormJob across nodes (threads) through the real gRPC rendezvous service.
#include "server/rendezvous/job_formation.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rendezvous/kv_store.h"
#include "server/rendezvous/rendezvous_client.h"
#include "server/rendezvous/rendezvous_service.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::ParamSpec Param(const std::string& name, std::vector<int64_t> shape,
                    v1::DType dtype = v1::FLOAT32) {
  v1::ParamSpec p;
  p.set_name(name);
  for (int64_t d : shape) p.add_shape(d);
  p.set_dtype(dtype);
  return p;
}

std::vector<v1::ParamSpec> Model() {
  return {Param("fc1.weight", {128, 64}), Param("fc1.bias", {128}),
          Param("fc2.weight", {10, 128})};
}

class JobFormationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = RendezvousServer::Start("127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // Runs FormJob for every option set concurrently, each with its own client.
  std::vector<absl::StatusOr<JobLayout>> FormAll(
      const std::vector<JobFormationOptions>& nodes) {
    std::vector<absl::StatusOr<JobLayout>> results(nodes.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < nodes.size(); ++i) {
      threads.emplace_back([&, i] {
        RendezvousClient::Options options;
        options.address = server_->address();
        auto client = RendezvousClient::Create(options);
        ASSERT_TRUE(client.ok());
        results[i] = FormJob(**client, nodes[i]);
      });
    }
    for (auto& t : threads) t.join();
    return results;
  }

  static JobFormationOptions Node(const std::string& id, int local_world_size,
                                  int num_nodes = 3) {
    JobFormationOptions o;
    o.job_id = "job";
    o.node_id = id;
    o.num_nodes = num_nodes;
    o.local_world_size = local_world_size;
    o.params = Model();
    o.timeout = absl::Seconds(10);
    return o;
  }

  std::unique_ptr<RendezvousServer> server_;
};

TEST_F(JobFormationTest, RanksBySortedNodeIdWithUnevenLocalSizes) {
  // Arrival order differs from id order; local world sizes 2, 1, 3.
  auto results =
      FormAll({Node("node-c", 3), Node("node-a", 2), Node("node-b", 1)});
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << r.status();
  for (const auto& r : results) {
    EXPECT_EQ(r->num_nodes, 3);
    EXPECT_EQ(r->world_size, 6);
    EXPECT_THAT(r->NodeIds(), ElementsAre("node-a", "node-b", "node-c"));
    EXPECT_EQ(r->nodes[0].global_rank_offset, 0);
    EXPECT_EQ(r->nodes[1].global_rank_offset, 2);
    EXPECT_EQ(r->nodes[2].global_rank_offset, 3);
    EXPECT_EQ(r->nodes[2].local_world_size, 3);
  }
  EXPECT_EQ(results[0]->node_rank, 2);  // node-c
  EXPECT_EQ(results[0]->global_rank_offset, 3);
  EXPECT_EQ(results[1]->node_rank, 0);  // node-a
  EXPECT_EQ(results[2]->node_rank, 1);  // node-b
  EXPECT_EQ(results[2]->global_rank_offset, 2);
}

TEST_F(JobFormationTest, ExplicitRankWins) {
  auto a = Node("node-a", 1);
  auto b = Node("node-b", 1);
  auto c = Node("node-c", 1);
  c.node_rank = 0;
  auto results = FormAll({a, b, c});
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(results[0]->NodeIds(), ElementsAre("node-c", "node-a", "node-b"));
  EXPECT_EQ(results[2]->node_rank, 0);
  EXPECT_EQ(results[0]->node_rank, 1);
}

TEST_F(JobFormationTest, ConflictingExplicitRanksFailEveryone) {
  auto a = Node("node-a", 1, 2);
  auto b = Node("node-b", 1, 2);
  a.node_rank = 1;
  b.node_rank = 1;
  auto results = FormAll({a, b});
  for (const auto& r : results) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("node rank 1"));
  }
}

TEST_F(JobFormationTest, ModelMismatchFailsEveryNodeNamingParamAndNodes) {
  auto a = Node("node-a", 1);
  auto b = Node("node-b", 2);
  auto c = Node("node-c", 1);
  c.params[1] = Param("fc1.bias", {256});
  auto results = FormAll({a, b, c});
  for (const auto& r : results) {
    ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition)
        << r.status();
    const std::string message(r.status().message());
    EXPECT_THAT(message, HasSubstr("fc1.bias"));
    EXPECT_THAT(message, HasSubstr("[128]"));
    EXPECT_THAT(message, HasSubstr("[256]"));
    EXPECT_THAT(message, HasSubstr("node-a"));
    EXPECT_THAT(message, HasSubstr("node-c"));
  }
}

TEST_F(JobFormationTest, DTypeAndCountMismatchesAreDescribed) {
  auto ref = Model();
  auto other = Model();
  other[2].set_dtype(v1::FLOAT64);
  auto m = DescribeFingerprintMismatch(ref, "x", other, "y");
  ASSERT_TRUE(m.has_value());
  EXPECT_THAT(*m, HasSubstr("fc2.weight"));
  EXPECT_THAT(*m, HasSubstr("FLOAT64"));
  other = Model();
  other.push_back(Param("extra", {1}));
  m = DescribeFingerprintMismatch(ref, "x", other, "y");
  ASSERT_TRUE(m.has_value());
  EXPECT_THAT(*m, HasSubstr("'extra'"));
  EXPECT_THAT(*m, HasSubstr("only on node 'y'"));
  EXPECT_FALSE(DescribeFingerprintMismatch(ref, "x", Model(), "y").has_value());
}

TEST_F(JobFormationTest, MissingNodeTimesOutListingIt) {
  auto a = Node("node-a", 1);
  auto b = Node("node-b", 1);
  for (auto* o : {&a, &b}) {
    o->timeout = absl::Milliseconds(800);
    o->expected_node_ids = {"node-a", "node-b", "node-c"};
  }
  const absl::Time start = absl::Now();
  auto results = FormAll({a, b});
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (const auto& r : results) {
    ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded)
        << r.status();
    const std::string message(r.status().message());
    EXPECT_THAT(message, HasSubstr("only 2 of 3 nodes"));
    EXPECT_THAT(message, HasSubstr("missing: node-c"));
  }
}

TEST_F(JobFormationTest, TooManyNodesIsRefused) {
  auto results = FormAll({Node("node-a", 1, 1)});
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  EXPECT_EQ(results[0]->world_size, 1);
  auto extra = FormAll({Node("node-b", 1, 1)});
  EXPECT_EQ(extra[0].status().code(), absl::StatusCode::kFailedPrecondition);
}

// rendezvous.expected_node_ids is enforced by every node, not only used to
// name missing ones: a node not on its own list does not join at all...
TEST_F(JobFormationTest, ANodeNotOnItsOwnExpectedListDoesNotJoin) {
  auto c = Node("node-c", 1, 2);
  c.expected_node_ids = {"node-a", "node-b"};
  auto results = FormAll({c});
  ASSERT_EQ(results[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(results[0].status().message()),
              HasSubstr("this node's id is not in rendezvous.expected_node_ids "
                        "(node-a, node-b)"));
  EXPECT_EQ(server_->store().NumKeys("job"), 0u);
}

// ... and a formation some unlisted node joined (a coordinator without the
// list let it in) fails on the listed nodes, naming it.
TEST_F(JobFormationTest, AnUnexpectedMemberFailsTheFormationNamingIt) {
  auto a = Node("node-a", 1, 2);
  a.expected_node_ids = {"node-a", "node-b"};
  auto intruder = Node("node-x", 1, 2);
  auto results = FormAll({a, intruder});
  ASSERT_EQ(results[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(results[0].status().message()),
              HasSubstr("node 'node-x' joined but is not in "
                        "rendezvous.expected_node_ids"));
}

TEST(FormationNodeIdOfTest, NamesTheNodeOfMemberAndSlotKeysOnly) {
  EXPECT_EQ(FormationNodeIdOf("round3/member/node-a", "blob"), "node-a");
  // The daemons' prefix (node_formation.h) and node ids with '/'.
  EXPECT_EQ(FormationNodeIdOf("round3/members/member/node-a", "b"), "node-a");
  EXPECT_EQ(FormationNodeIdOf("round3/members/member/rack/1", ""), "rack/1");
  EXPECT_EQ(FormationNodeIdOf("round3/members/slot/12", "node-b"), "node-b");
  EXPECT_EQ(FormationNodeIdOf("round3/slot/x", "node-b"), std::nullopt);
  EXPECT_EQ(FormationNodeIdOf("round3/member/", "blob"), std::nullopt);
  EXPECT_EQ(FormationNodeIdOf("member/node-a", "blob"), std::nullopt);
  EXPECT_EQ(FormationNodeIdOf("round3/members/joined", "2"), std::nullopt);
  EXPECT_EQ(FormationNodeIdOf("round3/plan", "node-a"), std::nullopt);
  EXPECT_EQ(FormationNodeIdOf("round3/gloo/arrived/1", "x"), std::nullopt);
}

TEST_F(JobFormationTest, WorksOnInProcessStoreToo) {
  KvStore store;
  auto a = Node("solo", 4, 1);
  auto layout = FormJob(store, a);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->world_size, 4);
  EXPECT_EQ(layout->node_rank, 0);
}

}  // namespace
}  // namespace gradd
