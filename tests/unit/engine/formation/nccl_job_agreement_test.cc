// AgreeNcclJob (server/engine/formation/nccl_job_agreement.h): the nodes of a
// CUDA job as threads over the in-memory rendezvous store.
#include "server/engine/formation/nccl_job_agreement.h"

#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rendezvous/kv_store.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Gpu(char c) { return std::string(16, c); }

// Runs one agreement per offer (node rank = index) on its own thread.
std::vector<absl::StatusOr<NcclJobAgreement>> Agree(
    RendezvousStoreInterface& store, const std::vector<NcclNodeOffer>& offers,
    int* ids_drawn, absl::Duration timeout = absl::Seconds(10)) {
  std::vector<absl::StatusOr<NcclJobAgreement>> out(
      offers.size(), absl::UnknownError("not run"));
  std::vector<std::thread> nodes;
  for (size_t k = 0; k < offers.size(); ++k) {
    nodes.emplace_back([&, k] {
      NcclAgreementOptions o;
      o.job_id = "j";
      o.prefix = "round1";
      o.node_rank = static_cast<int>(k);
      o.num_nodes = static_cast<int>(offers.size());
      o.timeout = timeout;
      out[k] = AgreeNcclJob(store, o, offers[k],
                            [&]() -> absl::StatusOr<std::string> {
                              ++*ids_drawn;  // node 0's thread only
                              return std::string("\x01\x00\xffid", 5);
                            });
    });
  }
  for (std::thread& t : nodes) t.join();
  return out;
}

TEST(NcclJobAgreementTest, DistinctGpusGetRanksInNodeOrderAndOneId) {
  KvStore store;
  int drawn = 0;
  auto r = Agree(store,
                 {{true, {Gpu('a'), Gpu('b')}},
                  {true, {Gpu('c')}},
                  {true, {Gpu('d'), Gpu('e'), Gpu('f')}}},
                 &drawn);
  EXPECT_EQ(drawn, 1);
  const int first[] = {0, 2, 3};
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(r[k].ok()) << r[k].status();
    EXPECT_TRUE(r[k]->use_nccl);
    EXPECT_EQ(r[k]->world, 6);
    EXPECT_EQ(r[k]->first_rank, first[k]);
    EXPECT_EQ(r[k]->unique_id, std::string("\x01\x00\xffid", 5));
  }
}

TEST(NcclJobAgreementTest, AGpuTwoNodesShareMeansEveryNodeStages) {
  KvStore store;
  int drawn = 0;
  auto r = Agree(store, {{true, {Gpu('a')}}, {true, {Gpu('a')}}}, &drawn);
  EXPECT_EQ(drawn, 0);
  for (const auto& a : r) {
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_FALSE(a->use_nccl);
    EXPECT_THAT(a->why_not, AllOf(HasSubstr("GPU 61616161"),
                                  HasSubstr("serves node ranks 0 and 1")));
    EXPECT_TRUE(a->unique_id.empty());
  }
}

TEST(NcclJobAgreementTest, ANodeWithoutNcclIsNamed) {
  KvStore store;
  int drawn = 0;
  auto r = Agree(store, {{true, {Gpu('a')}}, {false, {Gpu('b')}}}, &drawn);
  for (const auto& a : r) {
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_FALSE(a->use_nccl);
    EXPECT_EQ(a->why_not, "node rank 1 has no NCCL");
  }
  EXPECT_EQ(drawn, 0);
}

TEST(NcclJobAgreementTest, AMissingNodeTimesOutNamingIt) {
  KvStore store;
  NcclAgreementOptions o;
  o.job_id = "j";
  o.prefix = "round2";
  o.node_rank = 0;
  o.num_nodes = 2;
  o.timeout = absl::Milliseconds(50);
  absl::StatusOr<NcclJobAgreement> a = AgreeNcclJob(
      store, o, {true, {Gpu('a')}},
      []() -> absl::StatusOr<std::string> { return std::string("id"); });
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(a.status().message(),
              AllOf(HasSubstr("job 'j'"), HasSubstr("node rank 1")));
}

TEST(NcclJobAgreementTest, MalformedOffersAreRefused) {
  KvStore store;
  ASSERT_TRUE(store.Set("j", "round3/nccl/node/1", "nccl=1;gpus=zz").ok());
  NcclAgreementOptions o;
  o.job_id = "j";
  o.prefix = "round3";
  o.num_nodes = 2;
  absl::StatusOr<NcclJobAgreement> a = AgreeNcclJob(
      store, o, {true, {Gpu('a')}},
      []() -> absl::StatusOr<std::string> { return std::string("id"); });
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("node rank 1"));
}

}  // namespace
}  // namespace gradd
