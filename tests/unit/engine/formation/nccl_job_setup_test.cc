// SetUpNcclJob (server/engine/formation/nccl_job_setup.h): the nodes of a CUDA
// job as threads over the in-memory rendezvous store, each with a fake
// platform; every node must take the same path.
#include "server/engine/formation/nccl_job_setup.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rendezvous/kv_store.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class FakeComms final : public NcclJobCommsInterface {
 public:
  explicit FakeComms(std::atomic<int>* aborts) : aborts_(aborts) {}
  void Abort() override { aborts_->fetch_add(1); }

 private:
  std::atomic<int>* aborts_;
};

struct FakeNode {
  bool nccl = true;
  std::string why_not;  // when !nccl
  std::vector<std::string> uuids;
  absl::Status connect = absl::OkStatus();
};

class FakePlatform final : public NcclJobPlatformInterface {
 public:
  explicit FakePlatform(FakeNode node) : node_(std::move(node)) {}
  NcclNodeOffer Offer(const std::vector<int>& gpus,
                      std::string* why_not) override {
    offered_gpus = gpus;
    if (!node_.nccl) *why_not = node_.why_not;
    return NcclNodeOffer{node_.nccl, node_.uuids};
  }
  absl::StatusOr<std::string> MakeUniqueId() override {
    return std::string("the-id");
  }
  absl::StatusOr<std::unique_ptr<NcclJobCommsInterface>> Connect(
      const std::string& unique_id, int world, int first_rank,
      const std::vector<int>& gpus, absl::Duration timeout,
      const std::string& context) override {
    connected_with = {unique_id, std::to_string(world),
                      std::to_string(first_rank)};
    if (!node_.connect.ok()) return node_.connect;
    return std::make_unique<FakeComms>(&aborts);
  }

  std::vector<int> offered_gpus;
  std::vector<std::string> connected_with;
  std::atomic<int> aborts{0};

 private:
  FakeNode node_;
};

std::string Gpu(char c) { return std::string(16, c); }

struct Result {
  std::unique_ptr<FakePlatform> platform;
  absl::StatusOr<NcclJobSetup> setup = absl::UnknownError("not run");
};

std::vector<Result> RunNodes(RendezvousStoreInterface& store,
                             std::vector<FakeNode> nodes,
                             absl::Duration timeout = absl::Seconds(10),
                             const std::string& prefix = "round1") {
  std::vector<Result> out(nodes.size());
  std::vector<std::thread> threads;
  for (size_t k = 0; k < nodes.size(); ++k) {
    out[k].platform = std::make_unique<FakePlatform>(nodes[k]);
  }
  for (size_t k = 0; k < nodes.size(); ++k) {
    threads.emplace_back([&, k] {
      NcclJobSetupOptions o;
      o.job_id = "j";
      o.prefix = prefix;
      o.node_rank = static_cast<int>(k);
      o.num_nodes = static_cast<int>(nodes.size());
      o.timeout = timeout;
      out[k].setup = SetUpNcclJob(store, o, *out[k].platform, {3, 1});
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

TEST(JobGpusTest, DistinctInOrderOfFirstAppearance) {
  EXPECT_THAT(JobGpus({2, 0, 2, 1, 0}), ElementsAre(2, 0, 1));
  EXPECT_TRUE(JobGpus({}).empty());
}

TEST(NcclJobSetupTest, EveryNodeConnectsWithItsRanksAndTheSharedId) {
  KvStore store;
  auto r = RunNodes(store, {{true, "", {Gpu('a'), Gpu('b')}},
                            {true, "", {Gpu('c'), Gpu('d')}}});
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(r[k].setup.ok()) << r[k].setup.status();
    EXPECT_NE(r[k].setup->comms, nullptr);
    EXPECT_EQ(r[k].setup->world, 4);
    EXPECT_EQ(r[k].setup->first_rank, 2 * k);
    EXPECT_TRUE(r[k].setup->staged_because.empty());
    EXPECT_THAT(r[k].platform->offered_gpus, ElementsAre(3, 1));
    EXPECT_THAT(r[k].platform->connected_with,
                ElementsAre("the-id", "4", std::to_string(2 * k)));
    EXPECT_EQ(r[k].platform->aborts.load(), 0);
  }
}

TEST(NcclJobSetupTest, ANodeWithoutNcclStagesEveryNodeWithItsReason) {
  KvStore store;
  auto r = RunNodes(
      store, {{true, "", {Gpu('a')}},
              {false, "NCCL is not available: cannot load libnccl.so.2"}});
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(r[k].setup.ok()) << r[k].setup.status();
    EXPECT_EQ(r[k].setup->comms, nullptr);
    EXPECT_THAT(r[k].setup->staged_because, HasSubstr("node rank 1"));
    EXPECT_TRUE(r[k].platform->connected_with.empty()) << "k=" << k;
  }
  // The node that lacks NCCL says why, in its own words.
  EXPECT_THAT(r[1].setup->staged_because, HasSubstr("cannot load"));
}

TEST(NcclJobSetupTest, TwoDaemonsOnOneGpuStage) {
  KvStore store;
  auto r = RunNodes(store, {{true, "", {Gpu('a')}}, {true, "", {Gpu('a')}}});
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(r[k].setup.ok()) << r[k].setup.status();
    EXPECT_EQ(r[k].setup->comms, nullptr);
    EXPECT_THAT(r[k].setup->staged_because,
                AllOf(HasSubstr("serves node ranks 0 and 1"),
                      HasSubstr("NCCL needs a GPU per rank")));
  }
}

TEST(NcclJobSetupTest, AConnectFailingOnOneNodeStagesEveryNode) {
  KvStore store;
  auto r = RunNodes(
      store, {{true, "", {Gpu('a')}},
              {true, "", {Gpu('b')}},
              {true,
               "",
               {Gpu('c')},
               absl::UnavailableError("ncclCommInitRank: remote error")}});
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(r[k].setup.ok()) << r[k].setup.status();
    EXPECT_EQ(r[k].setup->comms, nullptr) << "k=" << k;
    EXPECT_THAT(r[k].setup->staged_because,
                AllOf(HasSubstr("NCCL did not connect on node rank 2"),
                      HasSubstr("remote error")));
  }
  // The nodes that did connect tore their communicators down.
  EXPECT_EQ(r[0].platform->aborts.load(), 1);
  EXPECT_EQ(r[1].platform->aborts.load(), 1);
  EXPECT_EQ(r[2].platform->aborts.load(), 0);
}

TEST(NcclJobSetupTest, ANodeThatNeverReportsFailsTheOthersNamingIt) {
  // Node rank 1 published its offer and connected but never reported (it
  // died): node 0 must not go on with NCCL alone.
  KvStore store;
  ASSERT_TRUE(
      store
          .Set("j", "round1/nccl/node/1", "nccl=1;gpus=" + std::string(32, 'b'))
          .ok());
  FakePlatform platform(FakeNode{true, "", {Gpu('a')}});
  NcclJobSetupOptions o;
  o.job_id = "j";
  o.prefix = "round1";
  o.node_rank = 0;
  o.num_nodes = 2;
  o.timeout = absl::Milliseconds(200);
  absl::StatusOr<NcclJobSetup> s = SetUpNcclJob(store, o, platform, {0});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.status().message(),
              AllOf(HasSubstr("job 'j' node rank 0"),
                    HasSubstr("waiting for node rank 1 to report")));
  EXPECT_EQ(platform.aborts.load(), 1);
}

class CountingPlatform final : public NcclJobPlatformInterface {
 public:
  explicit CountingPlatform(std::string uuid) : uuid_(std::move(uuid)) {}
  NcclNodeOffer Offer(const std::vector<int>&, std::string*) override {
    return NcclNodeOffer{true, {uuid_}};
  }
  absl::StatusOr<std::string> MakeUniqueId() override {
    return absl::StrCat("id-", ++ids);
  }
  absl::StatusOr<std::unique_ptr<NcclJobCommsInterface>> Connect(
      const std::string& unique_id, int world, int first_rank,
      const std::vector<int>&, absl::Duration, const std::string&) override {
    connected_with = {unique_id, std::to_string(world),
                      std::to_string(first_rank)};
    return std::make_unique<FakeComms>(&aborts);
  }
  std::atomic<int> ids{0};
  std::vector<std::string> connected_with;
  std::atomic<int> aborts{0};

 private:
  std::string uuid_;
};

// Nodes `ids` (by their old node rank) form the group `prefix` in that
// order, through SetUpNcclForGroup as JobManager calls it.
void FormGroup(
    KvStore& store, std::vector<CountingPlatform*> nodes,
    const std::string& prefix,
    std::vector<absl::StatusOr<std::shared_ptr<NcclJobSetup>>>* out) {
  out->assign(nodes.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t k = 0; k < nodes.size(); ++k) {
    threads.emplace_back([&, k] {
      JobLayout layout;
      layout.node_rank = static_cast<int>(k);
      layout.num_nodes = static_cast<int>(nodes.size());
      (*out)[k] = SetUpNcclForGroup(store, *nodes[k], "j", prefix, layout,
                                    absl::Seconds(10), {0},
                                    absl::Now() + absl::Seconds(30));
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(NcclJobSetupTest, AReFormedGroupConnectsAFreshCommunicatorOfItsNodes) {
  // Three nodes form; node 1 is lost; the two others re-form under the
  // epoch's prefix; then the lost one is admitted back, last.
  KvStore store;
  CountingPlatform a(Gpu('a')), b(Gpu('b')), c(Gpu('c'));
  std::vector<absl::StatusOr<std::shared_ptr<NcclJobSetup>>> r;
  FormGroup(store, {&a, &b, &c}, "round1", &r);
  for (auto& s : r) ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(c.connected_with, ElementsAre("id-1", "3", "2"));

  FormGroup(store, {&a, &c}, "elastic1/epoch1", &r);
  for (auto& s : r) {
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_NE((*s)->comms, nullptr);
    EXPECT_EQ((*s)->world, 2);
  }
  // A new id (not the old group's), the survivors renumbered.
  EXPECT_THAT(a.connected_with, ElementsAre("id-2", "2", "0"));
  EXPECT_THAT(c.connected_with, ElementsAre("id-2", "2", "1"));

  FormGroup(store, {&a, &c, &b}, "elastic1/epoch2", &r);
  for (auto& s : r) ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(b.connected_with, ElementsAre("id-3", "3", "2"));
  EXPECT_THAT(c.connected_with, ElementsAre("id-3", "3", "1"));
  EXPECT_EQ(a.aborts.load() + b.aborts.load() + c.aborts.load(), 0);
}

TEST(NcclJobSetupTest, SetupKeysNameEveryKeyTheSetupWrites) {
  KvStore store;
  auto r = RunNodes(store, {{true, "", {Gpu('a')}}, {true, "", {Gpu('b')}}},
                    absl::Seconds(10), "elastic1/epoch3");
  for (auto& n : r) ASSERT_TRUE(n.setup.ok()) << n.setup.status();
  ASSERT_GT(store.NumKeys("j"), 0u);
  for (const std::string& key : NcclJobSetupKeys("elastic1/epoch3", 2)) {
    EXPECT_TRUE(store.Delete("j", key).ok()) << key;
  }
  EXPECT_EQ(store.NumKeys("j"), 0u);
}

}  // namespace
}  // namespace gradd
