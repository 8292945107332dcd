// The device-aware plan: DDP's buckets per (dtype, device), each device
// kind laid out in its own memory (the memfd, the rank's GPU memory).
#include <vector>

#include "common/bucket_planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;

ParamInfo P(std::string name, int64_t n, DeviceKind device,
            DType dtype = DType::kFloat32) {
  return ParamInfo{std::move(name), {n}, dtype, device};
}

TEST(DevicePlanTest, CudaAndCpuParametersNeverShareABucket) {
  // Registration order a, b, c, d; planned back to front.
  std::vector<ParamInfo> params = {
      P("a", 10, DeviceKind::kCuda), P("b", 10, DeviceKind::kCpu),
      P("c", 10, DeviceKind::kCuda), P("d", 10, DeviceKind::kCpu)};
  absl::StatusOr<BucketPlan> plan = PlanBuckets(params, PlannerOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->buckets.size(), 2u);
  // Ordered by first ready parameter: d (cpu) first, then c (cuda).
  EXPECT_EQ(plan->buckets[0].device, DeviceKind::kCpu);
  EXPECT_THAT(plan->buckets[0].params, ElementsAre(3, 1));
  EXPECT_EQ(plan->buckets[1].device, DeviceKind::kCuda);
  EXPECT_THAT(plan->buckets[1].params, ElementsAre(2, 0));
  // Each memory starts at 0.
  EXPECT_EQ(plan->buckets[0].offset, 0u);
  EXPECT_EQ(plan->buckets[1].offset, 0u);
  EXPECT_EQ(plan->total_bytes, 4096u);
  EXPECT_EQ(plan->device_bytes, 4096u);
}

TEST(DevicePlanTest, EachDeviceKindHasItsOwnCaps) {
  // 300 floats = 1200 bytes per parameter; first cap 2000 bytes, then 4000.
  PlannerOptions caps;
  caps.first_bucket_cap_bytes = 2000;
  caps.bucket_cap_bytes = 4000;
  std::vector<ParamInfo> params;
  for (int i = 0; i < 6; ++i) {
    params.push_back(P("g" + std::to_string(i), 300, DeviceKind::kCuda));
  }
  absl::StatusOr<BucketPlan> plan = PlanBuckets(params, caps);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->buckets.size(), 2u);
  EXPECT_THAT(plan->buckets[0].params, ElementsAre(5, 4));  // 2400 >= 2000
  EXPECT_THAT(plan->buckets[1].params, ElementsAre(3, 2, 1, 0));
  EXPECT_EQ(plan->buckets[1].offset, 2560u);  // 2400 rounded to 256
  EXPECT_EQ(plan->total_bytes, 4096u);        // the memfd's one page
}

TEST(DevicePlanTest, MaxPlanBytesPerDeviceKind) {
  std::vector<ParamInfo> params = {P("a", 1000, DeviceKind::kCuda),
                                   P("b", 10, DeviceKind::kCpu)};
  EXPECT_EQ(MaxPlanBytes(params, DeviceKind::kCuda), 4096u);
  EXPECT_EQ(MaxPlanBytes(params), 4096u);
  EXPECT_EQ(MaxPlanBytes({P("b", 10, DeviceKind::kCpu)}, DeviceKind::kCuda),
            0u);
}

TEST(DevicePlanTest, RebuildKeepsDevicesApart) {
  std::vector<ParamInfo> params = {P("a", 10, DeviceKind::kCuda),
                                   P("b", 10, DeviceKind::kCpu),
                                   P("c", 10, DeviceKind::kCuda)};
  absl::StatusOr<BucketPlan> plan =
      PlanBucketsInOrder(params, {0, 1, 2}, PlannerOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->buckets.size(), 2u);
  for (const Bucket& b : plan->buckets) {
    for (int32_t p : b.params) EXPECT_EQ(params[p].device, b.device);
  }
}

}  // namespace
}  // namespace gradd
