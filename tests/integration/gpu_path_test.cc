// The GPU data path between real processes, without a GPU: gradd with
// --fake_gpus (host memory standing in for one GPU) and test trainers whose
// every parameter is a CUDA parameter (--cuda, GRADD_FAKE_GPU_UUID). The
// protocol is the real one: device parameters in the attach, the device
// memory's fd as the fifth fd, gradients as views into it, MarkReadyOn /
// WaitAllOn. The same trainers on a real GPU: gpu_device_test (label gpu).
#include <stdlib.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace gradd::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kFakeGpu[] = "00112233445566778899aabbccddeeff";

class GpuPathTest : public GraddTest {
 protected:
  void SetUp() override {
    daemon_flags_ = {"--fake_gpus", kFakeGpu};
    // Inherited by every trainer spawned below.
    setenv("GRADD_FAKE_GPU_UUID", kFakeGpu, 1);
    GraddTest::SetUp();
  }
  void TearDown() override {
    GraddTest::TearDown();
    unsetenv("GRADD_FAKE_GPU_UUID");
  }
};

// Two trainer processes sharing the one GPU, 100 iterations of the mixed
// model (fp32, fp64, fp16, bf16; random ready order), every value checked.
TEST_F(GpuPathTest, TwoTrainersShareOneGpuEveryValueChecked) {
  std::vector<Exit> exits =
      RunJob("gpu", 2, {"--cuda", "true", "--iterations", "100", "--seed", "3"},
             milliseconds(60000));
  for (size_t r = 0; r < exits.size(); ++r) {
    EXPECT_EQ(exits[r].code, 0) << "rank " << r << ":\n" << exits[r].output;
    EXPECT_THAT(exits[r].output, HasSubstr("PASS iterations=100"));
  }
}

// Bucket rebuild of a CUDA job, as torch's DDP rebuilds CUDA buckets after
// the first iteration: two trainers sharing the GPU, a random ready order
// (not the registration order), so the plan built from local rank 0's
// order differs from the first one. Right after the rebuild every rank
// checks that every gradient still holds iteration 1's average at its new
// place in the device memory (moved through the device client), then 11
// more iterations with every value checked.
TEST_F(GpuPathTest, TwoTrainersRebuildTheirCudaBuckets) {
  std::vector<Exit> exits =
      RunJob("gpu-rebuild", 2,
             {"--cuda", "true", "--iterations", "12", "--seed", "4242",
              "--rebuild-after", "1", "--bucket-cap-mb", "0.01",
              "--first-bucket-cap-mb", "0.002"},
             milliseconds(60000));
  ASSERT_EQ(exits.size(), 2u);
  for (size_t r = 0; r < exits.size(); ++r) {
    ASSERT_EQ(exits[r].code, 0) << "rank " << r << ":\n" << exits[r].output;
    EXPECT_THAT(exits[r].output,
                AllOf(HasSubstr("REBUILT"), HasSubstr("PASS iterations=12")));
  }
  const std::string plan = ReportedValue(exits[0].output, "plan");
  const std::string before = ReportedValue(exits[0].output, "before");
  ASSERT_FALSE(plan.empty());
  EXPECT_EQ(ReportedValue(exits[1].output, "plan"), plan);
  EXPECT_NE(plan, before);
  // Inside every bucket the parameters follow local rank 0's order.
  const std::vector<int> order =
      ReportedInts(ReportedValue(exits[0].output, "order"));
  ASSERT_EQ(order.size(), 24u);
  ExpectBucketsFollow(plan, order, "local rank 0's");
}

// The large model (buckets of up to ~1 MB, several dtypes) rebuilt: whole
// buckets change places, the gradients move by large runs.
TEST_F(GpuPathTest, LargeCudaBucketsRebuild) {
  std::vector<Exit> exits =
      RunJob("gpu-rebuild-large", 2,
             {"--cuda", "true", "--model", "large", "--iterations", "5",
              "--seed", "9", "--rebuild-after", "1", "--bucket-cap-mb", "1",
              "--first-bucket-cap-mb", "1"},
             milliseconds(60000));
  for (size_t r = 0; r < exits.size(); ++r) {
    EXPECT_EQ(exits[r].code, 0) << "rank " << r << ":\n" << exits[r].output;
    EXPECT_THAT(exits[r].output,
                AllOf(HasSubstr("REBUILT"), HasSubstr("PASS iterations=5")));
  }
  // Seed 9's order puts the float16 bucket before the float64 one.
  EXPECT_NE(ReportedValue(exits[0].output, "plan"),
            ReportedValue(exits[0].output, "before"));
}

TEST_F(GpuPathTest, AGpuTheDaemonDoesNotHaveIsRefusedAtAttach) {
  setenv("GRADD_FAKE_GPU_UUID", "ffeeddccbbaa99887766554433221100", 1);
  Proc r0 = SpawnTrainer("elsewhere", 0, 1, {"--cuda", "true"});
  Exit e = Wait(r0, milliseconds(20000));
  EXPECT_EQ(e.code, 3) << e.output;
  EXPECT_THAT(e.output,
              AllOf(HasSubstr("ERROR code=5"),  // NOT_FOUND
                    HasSubstr("GPU-ffeeddcc-bbaa-9988-7766-554433221100 is "
                              "not visible to the daemon")));
}

// A trainer killed mid-iteration fails its job (the survivor hears which
// rank), the daemon releases the job's device memory and serves the next
// job on the same GPU.
TEST_F(GpuPathTest, TrainerKilledMidIteration) {
  ExpectKilledTrainerFailsItsJob({"--cuda", "true"}, milliseconds(30000));
}

// Device memory counts against max_job_memory_bytes (job_memory.h): the
// large model's ~3.2 MB per rank fits the limit as parameters and as
// shared memory (one page per rank, every parameter on the GPU), but not
// twice over on the device.
TEST_F(GpuPathTest, DeviceMemoryCountsAgainstTheJobLimit) {
  ASSERT_TRUE(StopDaemon().has_value());
  const std::string config = dir_ + "/limit.yaml";
  {
    std::ofstream f(config);
    f << "max_job_memory_bytes: 5000000\n";
  }
  daemon_flags_.insert(daemon_flags_.end(), {"--config", config});
  ASSERT_TRUE(StartDaemon());
  std::vector<Exit> exits = RunJob(
      "too-big", 2, {"--cuda", "true", "--model", "large", "--iterations", "2"},
      milliseconds(30000));
  for (const Exit& e : exits) {
    EXPECT_EQ(e.code, 3) << e.output;
    EXPECT_THAT(e.output,
                AllOf(HasSubstr("ERROR code=8"),  // RESOURCE_EXHAUSTED
                      HasSubstr("bytes of shared memory (4096 x 2 ranks)"),
                      HasSubstr("bytes of device memory"),
                      HasSubstr("max_job_memory_bytes) is 5000000")));
  }
  // A job that fits still runs.
  ExpectHealthyJob("small");
}

// Two daemons with one trainer each on the (fake) GPU: a multi-node CUDA
// job, every value checked against the global world size. On a real GPU
// the same job goes through the host staging (gpu_device_test).
TEST_F(GpuPathTest, TwoDaemonsOneTrainerEach) {
  std::vector<std::string> sockets = StartNodeDaemons(2);
  ASSERT_EQ(sockets.size(), 2u);
  std::vector<Exit> exits = RunOneTrainerPerNode(
      sockets, "two-nodes", {"--cuda", "true", "--iterations", "50"},
      milliseconds(60000));
  for (const Exit& e : exits) {
    EXPECT_EQ(e.code, 0) << e.output;
    // Global ranks 0 and 1 of 2: the job spans both daemons.
    EXPECT_THAT(e.output,
                AllOf(HasSubstr(" world=2 "), HasSubstr("PASS iterations=50")));
  }
}

// The rebuild of a multi-node CUDA job: the nodes agree on node rank 0's
// order and switch together; every value checked before and after.
TEST_F(GpuPathTest, TwoDaemonsRebuildTheirCudaBuckets) {
  std::vector<std::string> sockets = StartNodeDaemons(2);
  ASSERT_EQ(sockets.size(), 2u);
  std::vector<Exit> exits =
      RunOneTrainerPerNode(sockets, "two-nodes-rebuild",
                           {"--cuda", "true", "--iterations", "10", "--seed",
                            "11", "--rebuild-after", "1", "--bucket-cap-mb",
                            "0.01", "--first-bucket-cap-mb", "0.002"},
                           milliseconds(60000));
  ASSERT_EQ(exits.size(), 2u);
  for (const Exit& e : exits) {
    ASSERT_EQ(e.code, 0) << e.output;
    EXPECT_THAT(e.output, AllOf(HasSubstr(" world=2 "), HasSubstr("REBUILT"),
                                HasSubstr("PASS iterations=10")));
  }
  EXPECT_EQ(ReportedValue(exits[0].output, "plan"),
            ReportedValue(exits[1].output, "plan"));
  EXPECT_NE(ReportedValue(exits[0].output, "plan"),
            ReportedValue(exits[0].output, "before"));
}

// The C ABI's GPU calls (param_devices, cuda_device, the _on_stream
// calls), from C.
TEST_F(GpuPathTest, CAbi) {
  std::vector<Proc> ps;
  for (int r = 0; r < 2; ++r) {
    ps.push_back(
        Spawn(absl::StrCat("c", r), {GRADD_C_TRAINER, "fakecuda", socket_,
                                     "c-gpu", absl::StrCat(r), "2", "20"}));
  }
  for (const Exit& e : WaitAll(ps, milliseconds(30000))) {
    EXPECT_EQ(e.code, 0) << e.output;
    EXPECT_THAT(e.output, HasSubstr("PASS"));
  }
}

// CPU jobs are unchanged next to the GPU ones.
TEST_F(GpuPathTest, CpuJobsRunBesideThem) { ExpectHealthyJob("cpu"); }

}  // namespace
}  // namespace gradd::testing
