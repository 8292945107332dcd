// The GPU data path on a real GPU (ctest label gpu; skipped where there is
// no CUDA driver or device): the real daemon, cuMem memory and IPC events,
// the fused device reducer, with test trainers copying their gradients in
// and out through the driver. Two trainer processes share GPU 0.
#include <string>
#include <vector>

#include "common/cuda/driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace gradd::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class GpuDeviceTest : public GraddTest {
 protected:
  void SetUp() override {
    absl::StatusOr<const cuda::CudaDriver*> d = cuda::CudaDriver::Get();
    if (!d.ok()) GTEST_SKIP() << "no GPU: " << d.status();
    int count = 0;
    if ((*d)->cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
      GTEST_SKIP() << "no GPU";
    }
    GraddTest::SetUp();
  }
};

// 100 iterations, fp32/fp64/fp16/bf16 buckets, random ready order, every
// value checked on every rank.
TEST_F(GpuDeviceTest, TwoTrainersShareOneGpu) {
  std::vector<Exit> exits =
      RunJob("gpu", 2, {"--cuda", "true", "--iterations", "100", "--seed", "5"},
             milliseconds(120000));
  for (size_t r = 0; r < exits.size(); ++r) {
    EXPECT_EQ(exits[r].code, 0) << "rank " << r << ":\n" << exits[r].output;
    EXPECT_THAT(exits[r].output, HasSubstr("PASS iterations=100"));
  }
}

TEST_F(GpuDeviceTest, LargeBucketsEveryDtype) {
  std::vector<Exit> exits =
      RunJob("gpu-large", 2,
             {"--cuda", "true", "--model", "large", "--iterations", "20",
              "--bucket-cap-mb", "1", "--first-bucket-cap-mb", "1"},
             milliseconds(120000));
  for (const Exit& e : exits) EXPECT_EQ(e.code, 0) << e.output;
}

// Two daemons with one trainer each, both on GPU 0: a multi-node CUDA job,
// its buckets staged through pinned host memory and Gloo between the
// daemons (server/engine/reduce/host_staging.h; NCCL cannot put two ranks on
// one GPU). Every dtype, every value checked against the global world size.
TEST_F(GpuDeviceTest, TwoDaemonsOneTrainerEachStageThroughHost) {
  std::vector<std::string> sockets = StartNodeDaemons(2);
  ASSERT_EQ(sockets.size(), 2u);
  std::vector<Exit> exits = RunOneTrainerPerNode(
      sockets, "two-nodes",
      {"--cuda", "true", "--iterations", "100", "--seed", "9"},
      milliseconds(120000));
  for (const Exit& e : exits) {
    EXPECT_EQ(e.code, 0) << e.output;
    // Global ranks 0 and 1 of 2: the job spans both daemons.
    EXPECT_THAT(e.output, AllOf(HasSubstr(" world=2 "),
                                HasSubstr("PASS iterations=100")));
  }
}

// Bucket rebuild after the first iteration, as torch's DDP does on CUDA:
// the gradients move inside the cuMem memory through the driver
// (client/src/device/device_client.h), the fused kernel reduces the new plan's
// buckets (new sizes, the same event slots), every value checked before
// and after; then the same across two daemons, staged through host
// memory (host_staging.h re-makes its buffers for the new plan).
TEST_F(GpuDeviceTest, TwoTrainersRebuildTheirBuckets) {
  std::vector<Exit> exits =
      RunJob("gpu-rebuild", 2,
             {"--cuda", "true", "--iterations", "30", "--seed", "4242",
              "--rebuild-after", "1", "--bucket-cap-mb", "0.01",
              "--first-bucket-cap-mb", "0.002"},
             milliseconds(120000));
  for (size_t r = 0; r < exits.size(); ++r) {
    EXPECT_EQ(exits[r].code, 0) << "rank " << r << ":\n" << exits[r].output;
    EXPECT_THAT(exits[r].output,
                AllOf(HasSubstr("REBUILT"), HasSubstr("PASS iterations=30")));
  }
}

TEST_F(GpuDeviceTest, TwoDaemonsRebuildStagedBuckets) {
  std::vector<std::string> sockets = StartNodeDaemons(2);
  ASSERT_EQ(sockets.size(), 2u);
  std::vector<Exit> exits =
      RunOneTrainerPerNode(sockets, "two-nodes-rebuild",
                           {"--cuda", "true", "--iterations", "20", "--seed",
                            "11", "--rebuild-after", "1", "--bucket-cap-mb",
                            "0.01", "--first-bucket-cap-mb", "0.002"},
                           milliseconds(120000));
  for (const Exit& e : exits) {
    EXPECT_EQ(e.code, 0) << e.output;
    EXPECT_THAT(e.output,
                AllOf(HasSubstr("REBUILT"), HasSubstr("PASS iterations=20")));
  }
}

TEST_F(GpuDeviceTest, TrainerKilledMidIteration) {
  ExpectKilledTrainerFailsItsJob({"--cuda", "true"}, milliseconds(60000));
}

}  // namespace
}  // namespace gradd::testing
