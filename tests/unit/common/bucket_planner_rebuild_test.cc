// PlanBucketsInOrder: DDP's bucket rebuild (Reducer::rebuild_buckets ->
// compute_bucket_assignment_by_size over the recorded ready order).
#include <algorithm>
#include <numeric>
#include <random>

#include "common/bucket_planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::vector<int32_t>> Params(const BucketPlan& plan) {
  std::vector<std::vector<int32_t>> out;
  for (const Bucket& b : plan.buckets) out.push_back(b.params);
  return out;
}

std::vector<size_t> Sizes(const BucketPlan& plan) {
  std::vector<size_t> out;
  for (const Bucket& b : plan.buckets) out.push_back(b.size_bytes);
  return out;
}

// The model of tests/python/test_rebuild.py's first case, registered in
// another order than it is used: torch 1.13 DDP with
// _DEFAULT_FIRST_BUCKET_BYTES = 5000 and bucket_cap_mb = 0.01 records the
// ready order 1 0 3 2 5 4 and rebuilds to "6016, 240000, 8800" with
// per-bucket indices "1 0 3, 2, 5 4" (its _get_ddp_logging_data()).
TEST(PlanBucketsInOrderTest, MatchesTorchsRebuildOnAHandCheckedModel) {
  const std::vector<ParamInfo> params = {
      {"c.weight", {4, 300}, DType::kFloat32},
      {"c.bias", {4}, DType::kFloat32},
      {"b.weight", {300, 200}, DType::kFloat32},
      {"b.bias", {300}, DType::kFloat32},
      {"a.weight", {200, 10}, DType::kFloat32},
      {"a.bias", {200}, DType::kFloat32},
  };
  PlannerOptions caps;
  caps.first_bucket_cap_bytes = 5000;
  caps.bucket_cap_bytes = static_cast<size_t>(0.01 * (1 << 20));
  auto plan = PlanBucketsInOrder(params, {1, 0, 3, 2, 5, 4}, caps);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Params(*plan), ElementsAre(ElementsAre(1, 0, 3), ElementsAre(2),
                                         ElementsAre(5, 4)));
  EXPECT_THAT(Sizes(*plan), ElementsAre(6016, 240000, 8800));
  // Laid out in bucket order, each parameter after the previous one.
  EXPECT_THAT(plan->buckets[0].param_offsets, ElementsAre(0, 16, 4816));
  EXPECT_EQ(plan->buckets[1].offset, 6144u);  // 6016 rounded up to 256
  EXPECT_LE(plan->total_bytes, MaxPlanBytes(params));

  // The attach-time plan (reverse registration order) differs: the ready
  // order is what moved b.bias before b.weight and a.* to the end.
  auto initial = PlanBuckets(params, caps);
  ASSERT_TRUE(initial.ok());
  EXPECT_NE(Params(*initial), Params(*plan));
}

TEST(PlanBucketsInOrderTest, ReverseOrderGivesTheAttachPlanForOneDtype) {
  std::vector<ParamInfo> params;
  for (int i = 0; i < 9; ++i) {
    params.push_back(
        {"p" + std::to_string(i), {100 + 37 * i}, DType::kFloat32});
  }
  PlannerOptions caps;
  caps.first_bucket_cap_bytes = 700;
  caps.bucket_cap_bytes = 1500;
  std::vector<int32_t> reverse(params.size());
  std::iota(reverse.rbegin(), reverse.rend(), 0);
  auto rebuilt = PlanBucketsInOrder(params, reverse, caps);
  auto initial = PlanBuckets(params, caps);
  ASSERT_TRUE(rebuilt.ok() && initial.ok());
  EXPECT_EQ(Params(*rebuilt), Params(*initial));
  EXPECT_EQ(Sizes(*rebuilt), Sizes(*initial));
}

// Buckets come in the order they closed, then each dtype's open bucket in
// dtype order; each dtype walks its own cap list.
TEST(PlanBucketsInOrderTest, MixedDtypesKeepClosingOrderThenOpenBuckets) {
  const std::vector<ParamInfo> params = {
      {"f0", {100}, DType::kFloat32},  // 400 B
      {"d0", {100}, DType::kFloat64},  // 800 B
      {"f1", {100}, DType::kFloat32},  // 400 B
      {"d1", {10}, DType::kFloat64},   // 80 B
      {"f2", {10}, DType::kFloat32},   // 40 B
  };
  PlannerOptions caps;
  caps.first_bucket_cap_bytes = 500;
  caps.bucket_cap_bytes = 1000;
  // d0 closes the first float64 bucket (800 >= 500) at position 1; f0 + f1
  // close the first float32 one (800 >= 500) at position 3; d1 and f2 stay
  // open.
  auto plan = PlanBucketsInOrder(params, {0, 1, 2, 3, 4}, caps);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Params(*plan), ElementsAre(ElementsAre(1), ElementsAre(0, 2),
                                         ElementsAre(4), ElementsAre(3)));
  EXPECT_EQ(plan->buckets[0].dtype, DType::kFloat64);
  EXPECT_EQ(plan->buckets[2].dtype, DType::kFloat32);
}

TEST(PlanBucketsInOrderTest, RejectsOrdersThatAreNotPermutations) {
  const std::vector<ParamInfo> params = {{"a", {4}, DType::kFloat32},
                                         {"b", {4}, DType::kFloat32},
                                         {"c", {4}, DType::kFloat32}};
  PlannerOptions caps;
  auto twice = PlanBucketsInOrder(params, {0, 1, 1}, caps);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(twice.status().message()),
              HasSubstr("parameter 1 (\"b\") twice, at positions 1 and 2"));
  auto outside = PlanBucketsInOrder(params, {0, 3, 1}, caps);
  EXPECT_THAT(std::string(outside.status().message()),
              HasSubstr("index 3 at position 1"));
  auto short_order = PlanBucketsInOrder(params, {0, 1}, caps);
  EXPECT_THAT(std::string(short_order.status().message()),
              HasSubstr("lists 2 parameters; the model has 3"));
}

// The memory laid out at attach must hold whatever plan a rebuild makes.
TEST(PlanBucketsInOrderTest, EveryPlanFitsMaxPlanBytes) {
  std::mt19937 rng(7);
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kFloat64,
                          DType::kBFloat16};
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<ParamInfo> params;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      params.push_back({"p" + std::to_string(i),
                        {static_cast<int64_t>(rng() % 300)},
                        dtypes[rng() % 4]});
    }
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    PlannerOptions caps;
    caps.first_bucket_cap_bytes = rng() % 600;
    caps.bucket_cap_bytes = rng() % 2000;
    auto plan = PlanBucketsInOrder(params, order, caps);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_LE(plan->total_bytes, MaxPlanBytes(params));
    EXPECT_LE(plan->buckets.size(), params.size());
    size_t placed = 0;
    for (const Bucket& b : plan->buckets) placed += b.params.size();
    EXPECT_EQ(placed, params.size());
  }
}

}  // namespace
}  // namespace gradd
