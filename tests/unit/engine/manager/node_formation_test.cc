// Multi-node job formation: the plan exchange format, and JobManagers of
// several "nodes" (one per test thread group) forming jobs through a real
// in-process rendezvous server over gRPC/TCP on loopback.
#include "server/engine/formation/node_formation.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config.h"
#include "server/engine/manager/job_manager.h"
#include "server/rendezvous/rendezvous_service.h"
#include "tests/unit/engine/manager/fake_session_registry.h"
#include "tests/unit/engine/manager/test_rank.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::vector<ParamInfo> Model() {
  return {{"a", {100}, DType::kFloat32},
          {"b", {3, 7}, DType::kFloat16},
          {"c", {4000}, DType::kFloat32},
          {"d", {5}, DType::kFloat64}};
}

BucketPlan Plan(double cap_kib = 4) {
  PlannerOptions options;
  options.bucket_cap_bytes = static_cast<size_t>(cap_kib * 1024);
  options.first_bucket_cap_bytes = 1024;
  return *PlanBuckets(Model(), options);
}

TEST(PlanExchangeTest, RoundTrips) {
  const BucketPlan plan = Plan();
  absl::StatusOr<BucketPlan> back = ParsePlan(SerializePlan(plan), Model());
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->buckets.size(), plan.buckets.size());
  EXPECT_EQ(back->total_bytes, plan.total_bytes);
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    EXPECT_EQ(back->buckets[b].dtype, plan.buckets[b].dtype);
    EXPECT_EQ(back->buckets[b].offset, plan.buckets[b].offset);
    EXPECT_EQ(back->buckets[b].size_bytes, plan.buckets[b].size_bytes);
    EXPECT_EQ(back->buckets[b].params, plan.buckets[b].params);
    EXPECT_EQ(back->buckets[b].param_offsets, plan.buckets[b].param_offsets);
  }
}

TEST(PlanExchangeTest, RejectsPlansThatDoNotFitTheModel) {
  const std::string good = SerializePlan(Plan());
  // A model with one more parameter: it is in no bucket.
  std::vector<ParamInfo> more = Model();
  more.push_back({"e", {1}, DType::kFloat32});
  EXPECT_THAT(std::string(ParsePlan(good, more).status().message()),
              HasSubstr("'e' is in none of the buckets"));
  // Another dtype for "b".
  std::vector<ParamInfo> other = Model();
  other[1].dtype = DType::kBFloat16;
  EXPECT_THAT(std::string(ParsePlan(good, other).status().message()),
              HasSubstr("cannot hold parameter 'b'"));
  // Larger "c" than the plan has room for.
  std::vector<ParamInfo> bigger = Model();
  bigger[2].shape = {4001};
  EXPECT_FALSE(ParsePlan(good, bigger).ok());

  BucketPlan dup = Plan();
  dup.buckets[0].params.push_back(dup.buckets[0].params[0]);
  dup.buckets[0].param_offsets.push_back(0);
  EXPECT_THAT(
      std::string(ParsePlan(SerializePlan(dup), Model()).status().message()),
      HasSubstr("a second time"));

  BucketPlan huge = Plan();
  huge.total_bytes = size_t{1} << 40;
  EXPECT_FALSE(ParsePlan(SerializePlan(huge), Model()).ok());

  BucketPlan overlap = Plan();
  ASSERT_GE(overlap.buckets.size(), 2u);
  overlap.buckets[1].offset = overlap.buckets[0].offset;
  EXPECT_FALSE(ParsePlan(SerializePlan(overlap), Model()).ok());

  EXPECT_FALSE(ParsePlan("not a plan \xff\xff", Model()).ok());
}

// One node: a JobManager with its own sessions, named `node_id`.
struct TestNode {
  TestNode(const std::string& node_id, const std::string& coordinator,
           uint32_t formation_timeout_ms = 20000) {
    config = DefaultConfig();
    config.set_node_id(node_id);
    config.set_attach_timeout_ms(30000);
    config.mutable_rendezvous()->set_coordinator_address(coordinator);
    config.mutable_rendezvous()->set_formation_timeout_ms(formation_timeout_ms);
    config.mutable_rendezvous()->set_collective_timeout_ms(10000);
    config.mutable_rendezvous()->set_expected_node_ids("node-a, node-b");
    config.mutable_rendezvous()->set_insecure(true);
    // The coordinator selector as the Daemon makes it. These tests are about
    // formation, not credentials (tests/unit/rendezvous/
    // rendezvous_auth_test.cc), so the daemons run insecure.
    CoordinatorSelector::Options selector;
    selector.coordinator_address = coordinator;
    selector.insecure = true;
    manager = std::make_unique<JobManager>(
        config, &sessions, &pool,
        /*reducer_factory=*/nullptr,
        *CoordinatorSelector::Create(std::move(selector)));
    sessions.set_observer(manager.get());
  }
  ~TestNode() { manager->Stop(); }

  // Starts the Attach of every local rank of `job`.
  std::vector<std::shared_ptr<PendingAttach>> Attach(
      const std::string& job, int world, int num_nodes, double cap_mb,
      const std::vector<TestParam>& params) {
    std::vector<std::shared_ptr<PendingAttach>> out;
    for (int r = 0; r < world; ++r) {
      opened.push_back(sessions.Open());
      v1::AttachRequest req = MakeRequest(job, r, world, opened.back(), params);
      req.set_num_nodes(num_nodes);
      req.set_bucket_cap_mb(cap_mb);
      req.set_first_bucket_cap_mb(cap_mb);
      out.push_back(StartAttach(*manager, std::move(req), absl::Seconds(30)));
    }
    return out;
  }

  // Every rank's session closes: the job ends (NumJobs() == 0 afterwards).
  void CloseAll() {
    for (uint64_t id : opened) sessions.Close(id);
    opened.clear();
  }

  v1::DaemonConfig config;
  FakeSessionRegistry sessions;
  std::vector<uint64_t> opened;
  ThreadPool pool{1};
  std::unique_ptr<JobManager> manager;
};

const std::vector<TestParam> kModel = {
    {"w0", {64, 32}, v1::FLOAT32},
    {"w1", {64, 32}, v1::FLOAT32},
    {"b1", {64}, v1::FLOAT32},
    {"w2", {10, 64}, v1::FLOAT16},
};

class NodeFormationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RendezvousServer::Options options;
    options.listen_address = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
        RendezvousServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<RendezvousServer> server_;
};

TEST_F(NodeFormationTest, TwoNodesGetGlobalRanksAndNodeZerosPlan) {
  TestNode a("node-a", server_->address());
  TestNode b("node-b", server_->address());
  // Node b asks for other bucket caps; node a (node rank 0) plans.
  auto pa = a.Attach("job", 2, 2, 0.001, kModel);
  auto pb = b.Attach("job", 1, 2, 1.0, kModel);
  std::vector<v1::AttachResponse> responses;
  for (auto& p : pa) {
    auto r = p->Get(absl::Seconds(30));
    ASSERT_TRUE(r.ok()) << r.status();
    responses.push_back(*r);
  }
  for (auto& p : pb) {
    auto r = p->Get(absl::Seconds(30));
    ASSERT_TRUE(r.ok()) << r.status();
    responses.push_back(*r);
  }
  std::set<int> ranks;
  for (size_t i = 0; i < responses.size(); ++i) {
    const v1::AttachResponse& r = responses[i];
    ranks.insert(r.global_rank());
    EXPECT_EQ(r.world_size(), 3);
    EXPECT_EQ(r.num_nodes(), 2);
    EXPECT_EQ(r.node_rank(), i < 2 ? 0 : 1);
    ASSERT_EQ(r.buckets_size(), responses[0].buckets_size());
    for (int k = 0; k < r.buckets_size(); ++k) {
      EXPECT_EQ(r.buckets(k).SerializeAsString(),
                responses[0].buckets(k).SerializeAsString());
    }
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  // 0.001 MiB caps split this model into several buckets; 1 MiB would not.
  EXPECT_GE(responses[0].buckets_size(), 3);
}

TEST_F(NodeFormationTest, MissingNodeFailsEveryLocalRankNamingIt) {
  TestNode a("node-a", server_->address(), /*formation_timeout_ms=*/1000);
  auto pa = a.Attach("job", 2, 2, 0, kModel);
  for (auto& p : pa) {
    auto r = p->Get(absl::Seconds(20));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded)
        << r.status();
    EXPECT_THAT(std::string(r.status().message()),
                AllOf(HasSubstr("job 'job'"), HasSubstr("missing: node-b")));
  }
  EXPECT_EQ(a.manager->NumJobs(), 0);
}

// Every Attach in `pending` succeeds; their global ranks.
std::set<int> ExpectFormed(
    std::vector<std::shared_ptr<PendingAttach>> pending) {
  std::set<int> ranks;
  for (auto& p : pending) {
    auto r = p->Get(absl::Seconds(30));
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) ranks.insert(r->global_rank());
  }
  return ranks;
}

TEST_F(NodeFormationTest, RetryAfterAMissingNodeFormsInTheNextRound) {
  TestNode a("node-a", server_->address(), /*formation_timeout_ms=*/1000);
  TestNode b("node-b", server_->address());
  for (auto& p : a.Attach("job", 1, 2, 0, kModel)) {
    EXPECT_EQ(p->Get().status().code(), absl::StatusCode::kDeadlineExceeded);
  }
  // Node b comes late, and node a's trainer tries again: they meet in the
  // next round, not in the failed one.
  auto pb = b.Attach("job", 1, 2, 0, kModel);
  auto pa = a.Attach("job", 1, 2, 0, kModel);
  std::vector<std::shared_ptr<PendingAttach>> all = pa;
  all.insert(all.end(), pb.begin(), pb.end());
  EXPECT_EQ(ExpectFormed(all), (std::set<int>{0, 1}));
}

TEST_F(NodeFormationTest, JobReformsAfterItsRanksLeft) {
  TestNode a("node-a", server_->address());
  TestNode b("node-b", server_->address());
  for (int round = 0; round < 3; ++round) {
    auto pa = a.Attach("job", 1, 2, 0, kModel);
    auto pb = b.Attach("job", 2, 2, 0, kModel);
    std::vector<std::shared_ptr<PendingAttach>> all = pa;
    all.insert(all.end(), pb.begin(), pb.end());
    EXPECT_EQ(ExpectFormed(all), (std::set<int>{0, 1, 2})) << round;
    a.CloseAll();
    b.CloseAll();
    EXPECT_EQ(a.manager->NumJobs(), 0);
    EXPECT_EQ(b.manager->NumJobs(), 0);
  }
}

TEST_F(NodeFormationTest, NoCoordinatorIsAClearError) {
  TestNode a("node-a", "");
  auto pa = a.Attach("job", 1, 2, 0, kModel);
  auto r = pa[0]->Get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("no rendezvous coordinator"));
}

TEST_F(NodeFormationTest, UnreachableCoordinatorFailsWithinTheJoinTimeout) {
  // Nothing listens on port 1.
  TestNode a("node-a", "127.0.0.1:1", /*formation_timeout_ms=*/1000);
  const absl::Time start = absl::Now();
  auto pa = a.Attach("job", 1, 2, 0, kModel);
  auto r = pa[0]->Get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(HasSubstr("job 'job'"), HasSubstr("127.0.0.1:1")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_F(NodeFormationTest, LocalRanksMustAgreeOnTheNodeSetup) {
  TestNode a("node-a", server_->address());
  std::vector<std::shared_ptr<PendingAttach>> pending;
  for (int r = 0; r < 2; ++r) {
    v1::AttachRequest req = MakeRequest("job", r, 2, a.sessions.Open(), kModel);
    req.set_num_nodes(r == 0 ? 2 : 3);
    pending.push_back(StartAttach(*a.manager, std::move(req)));
  }
  for (auto& p : pending) {
    auto r = p->Get();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("disagree on the multi-node setup"));
  }
}

}  // namespace
}  // namespace gradd
