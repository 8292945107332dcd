// The plan exchange between nodes with CUDA buckets: device kinds and the
// device memory's size survive the round trip, a bucket must fit its own
// memory, and a parameter must sit in a bucket of its device.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/formation/node_formation.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

std::vector<ParamInfo> Model() {
  return {{"a", {100}, DType::kFloat32, DeviceKind::kCuda},
          {"b", {7}, DType::kFloat32, DeviceKind::kCpu},
          {"c", {4000}, DType::kFloat16, DeviceKind::kCuda}};
}

TEST(DevicePlanExchangeTest, RoundTripsDevices) {
  const BucketPlan plan = *PlanBuckets(Model(), PlannerOptions{});
  ASSERT_GT(plan.device_bytes, 0u);
  absl::StatusOr<BucketPlan> back = ParsePlan(SerializePlan(plan), Model());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->device_bytes, plan.device_bytes);
  ASSERT_EQ(back->buckets.size(), plan.buckets.size());
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    EXPECT_EQ(back->buckets[b].device, plan.buckets[b].device);
    EXPECT_EQ(back->buckets[b].offset, plan.buckets[b].offset);
  }
}

TEST(DevicePlanExchangeTest, ABucketMustFitItsOwnMemory) {
  BucketPlan plan = *PlanBuckets(Model(), PlannerOptions{});
  // The fp16 CUDA bucket (8000 bytes) cannot live in the one-page memfd.
  for (Bucket& b : plan.buckets) {
    if (b.dtype == DType::kFloat16) b.device = DeviceKind::kCpu;
  }
  absl::StatusOr<BucketPlan> back = ParsePlan(SerializePlan(plan), Model());
  ASSERT_FALSE(back.ok());
  EXPECT_THAT(std::string(back.status().message()),
              HasSubstr("bytes of cpu memory"));
}

TEST(DevicePlanExchangeTest, AParameterMustSitOnItsDevice) {
  std::vector<ParamInfo> model = Model();
  const BucketPlan plan = *PlanBuckets(model, PlannerOptions{});
  model[0].device = DeviceKind::kCpu;  // this node thinks 'a' is on the CPU
  absl::StatusOr<BucketPlan> back = ParsePlan(SerializePlan(plan), model);
  ASSERT_FALSE(back.ok());
  EXPECT_THAT(std::string(back.status().message()),
              HasSubstr("cannot hold parameter 'a'"));
}

}  // namespace
}  // namespace gradd
