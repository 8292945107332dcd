// CudaNcclJobPlatform (server/engine/formation/cuda/nccl_job_platform.h)
// without a GPU: a node whose NCCL did not load offers none, and the whole job
// is staged with that reason (SetUpNcclJob over the in-memory store); a
// non-blocking communicator needs ncclCommInitRankConfig, which the
// toolkit's NCCL has; a malformed unique id is refused before NCCL sees it.
#include "server/engine/formation/cuda/nccl_job_platform.h"

#include <memory>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rendezvous/kv_store.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

absl::StatusOr<const nccl::NcclLibrary*> Missing() {
  static const absl::StatusOr<nccl::NcclLibrary>* lib =
      new absl::StatusOr<nccl::NcclLibrary>(
          nccl::NcclLibrary::Load("libgradd-no-nccl.so.2"));
  if (!lib->ok()) return lib->status();
  return &**lib;
}

TEST(CudaNcclJobPlatformTest, WithoutNcclTheNodeOffersNoneAndSaysWhy) {
  CudaNcclJobPlatform platform(Missing(), cuda::CudaDriver::Get());
  std::string why;
  NcclNodeOffer offer = platform.Offer({0}, &why);
  EXPECT_FALSE(offer.nccl);
  EXPECT_TRUE(offer.gpu_uuids.empty());
  EXPECT_THAT(why, HasSubstr("cannot load libgradd-no-nccl.so.2"));
  EXPECT_EQ(platform.MakeUniqueId().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(platform
                .Connect(std::string(128, '\0'), 2, 0, {0}, absl::Seconds(1),
                         "job 'j'")
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CudaNcclJobPlatformTest, EveryNodeStagesWhenOneLacksNccl) {
  KvStore store;
  std::vector<absl::StatusOr<NcclJobSetup>> out;
  for (int k = 0; k < 2; ++k) out.emplace_back(absl::UnknownError("not run"));
  std::vector<std::thread> nodes;
  for (int k = 0; k < 2; ++k) {
    nodes.emplace_back([&, k] {
      CudaNcclJobPlatform platform(Missing(), cuda::CudaDriver::Get());
      NcclJobSetupOptions o;
      o.job_id = "j";
      o.prefix = "round1";
      o.node_rank = k;
      o.num_nodes = 2;
      o.timeout = absl::Seconds(10);
      out[k] = SetUpNcclJob(store, o, platform, {0});
    });
  }
  for (std::thread& t : nodes) t.join();
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(out[k].ok()) << out[k].status();
    EXPECT_EQ(out[k]->comms, nullptr);
    EXPECT_THAT(out[k]->staged_because,
                AllOf(HasSubstr("node rank 0"), HasSubstr("NCCL")));
  }
  EXPECT_THAT(out[0]->staged_because, HasSubstr("cannot load"));
}

// Between nodes the communicators are non-blocking (created with a
// timeout, aborted when it passes): the toolkit's NCCL has the entry point.
// (ncclGetUniqueId is not called here: it starts NCCL's bootstrap thread,
// which outlives the test.)
TEST(CudaNcclJobPlatformTest, TheToolkitNcclHasNonBlockingInit) {
  absl::StatusOr<const nccl::NcclLibrary*> lib = nccl::NcclLibrary::Get();
  if (!lib.ok()) GTEST_SKIP() << lib.status();
  EXPECT_NE((*lib)->ncclCommInitRankConfig, nullptr);
}

TEST(CudaNcclJobPlatformTest, AMalformedUniqueIdIsRefused) {
  absl::StatusOr<const nccl::NcclLibrary*> lib = nccl::NcclLibrary::Get();
  if (!lib.ok()) GTEST_SKIP() << lib.status();
  CudaNcclJobPlatform platform(*lib, cuda::CudaDriver::Get());
  auto comms =
      platform.Connect("short", 2, 0, {0}, absl::Seconds(1), "job 'j'");
  EXPECT_EQ(comms.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(comms.status().message(), HasSubstr("unique id has 5 bytes"));
}

}  // namespace
}  // namespace gradd
