// The job memory check (server/engine/manager/job_memory.h): shared and device
// memory both count against max_job_memory_bytes.
#include "server/engine/manager/job_memory.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::vector<ParamInfo> Model() {
  return {ParamInfo{"w", {1000, 100}, DType::kFloat32, DeviceKind::kCuda},
          ParamInfo{"h", {5000}, DType::kFloat16, DeviceKind::kCuda},
          ParamInfo{"c", {10}, DType::kFloat32, DeviceKind::kCpu}};
}

TEST(JobMemoryTest, DeviceBytesCountPerRank) {
  absl::StatusOr<BucketPlan> plan = PlanBuckets(Model(), PlannerOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  JobMemoryNeed need = JobMemoryNeedOf(Model(), *plan, 4096, {0, 0}, 1);
  EXPECT_EQ(need.ranks, 2);
  EXPECT_EQ(need.shared_per_rank, MaxPlanBytes(Model()) + 4096);
  EXPECT_EQ(need.device_per_rank, MaxPlanBytes(Model(), DeviceKind::kCuda));
  EXPECT_GE(need.device_per_rank, 400000u + 10000u);
  EXPECT_EQ(need.device_extra, 0u);  // one GPU: the fused path, in place
  EXPECT_EQ(need.total(), 2 * need.shared_per_rank + 2 * need.device_per_rank);
}

TEST(JobMemoryTest, SeveralLocalGpusAddTheirAccumulators) {
  absl::StatusOr<BucketPlan> plan = PlanBuckets(Model(), PlannerOptions());
  ASSERT_TRUE(plan.ok());
  JobMemoryNeed need = JobMemoryNeedOf(Model(), *plan, 0, {0, 1, 1}, 1);
  // float32 stays float32, float16 accumulates in float32: per GPU.
  EXPECT_EQ(need.device_extra, 2u * (100000 * 4 + 5000 * 4));
  // Between nodes the buckets are staged: no accumulators on the device.
  EXPECT_EQ(JobMemoryNeedOf(Model(), *plan, 0, {0, 1}, 2).device_extra, 0u);
}

TEST(JobMemoryTest, CpuJobsNeedNoDeviceMemory) {
  std::vector<ParamInfo> cpu = {
      ParamInfo{"w", {1000}, DType::kFloat32, DeviceKind::kCpu}};
  absl::StatusOr<BucketPlan> plan = PlanBuckets(cpu, PlannerOptions());
  ASSERT_TRUE(plan.ok());
  JobMemoryNeed need = JobMemoryNeedOf(cpu, *plan, 0, {-1, -1}, 1);
  EXPECT_EQ(need.device_bytes(), 0u);
  absl::Status s = CheckJobMemory("j", need, 100);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("device")));
  EXPECT_TRUE(CheckJobMemory("j", need, need.total()).ok());
}

TEST(JobMemoryTest, OverTheLimitNamesBothNumbers) {
  absl::StatusOr<BucketPlan> plan = PlanBuckets(Model(), PlannerOptions());
  ASSERT_TRUE(plan.ok());
  JobMemoryNeed need = JobMemoryNeedOf(Model(), *plan, 0, {0, 0}, 1);
  // The shared memory alone fits; with the device memory it does not.
  const uint64_t limit = need.shared_bytes() + need.device_per_rank;
  absl::Status s = CheckJobMemory("gpu-job", need, limit);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(
      s.message(),
      AllOf(HasSubstr("job 'gpu-job'"),
            HasSubstr(
                absl::StrCat(need.shared_bytes(), " bytes of shared memory")),
            HasSubstr(
                absl::StrCat(need.device_bytes(), " bytes of device memory")),
            HasSubstr(absl::StrCat("max_job_memory_bytes) is ", limit))));
  EXPECT_TRUE(CheckJobMemory("gpu-job", need, need.total()).ok());
}

}  // namespace
}  // namespace gradd
