#include "common/bucket_planner.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ParamInfo P(std::string name, std::vector<int64_t> shape,
            DType dtype = DType::kFloat32) {
  return ParamInfo{std::move(name), std::move(shape), dtype};
}

// Structural invariants every plan must satisfy.
void ExpectWellFormed(const std::vector<ParamInfo>& params,
                      const BucketPlan& plan) {
  std::vector<int> seen(params.size(), 0);
  size_t prev_end = 0;
  for (const Bucket& b : plan.buckets) {
    ASSERT_FALSE(b.params.empty());
    ASSERT_EQ(b.params.size(), b.param_offsets.size());
    EXPECT_EQ(b.offset % kBucketAlignment, 0u);
    EXPECT_GE(b.offset, prev_end);
    size_t at = 0;
    for (size_t i = 0; i < b.params.size(); ++i) {
      const ParamInfo& p = params[b.params[i]];
      EXPECT_EQ(p.dtype, b.dtype);
      EXPECT_EQ(b.param_offsets[i], at) << "params are contiguous";
      EXPECT_EQ(b.param_offsets[i] % DTypeSize(b.dtype), 0u);
      at += p.bytes();
      ++seen[b.params[i]];
      // Reverse registration order inside a bucket.
      if (i > 0) {
        EXPECT_LT(b.params[i], b.params[i - 1]);
      }
    }
    EXPECT_EQ(b.size_bytes, at);
    prev_end = b.offset + b.size_bytes;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(seen[i], 1) << "parameter " << i;
  }
  EXPECT_EQ(plan.total_bytes % 4096, 0u);
  EXPECT_GE(plan.total_bytes, prev_end);
  EXPECT_LT(plan.total_bytes, prev_end + 4096 + 1);
}

std::vector<std::vector<int32_t>> Indices(const BucketPlan& plan) {
  std::vector<std::vector<int32_t>> out;
  for (const Bucket& b : plan.buckets) out.push_back(b.params);
  return out;
}

TEST(BucketPlannerTest, HandComputedSingleDtype) {
  // float32 bytes: 40 80 120 20 160 100 280 12. Reverse order with caps
  // [100, 250]:
  //   p7 (12) + p6 (280) = 292 >= 100 -> close {7,6}; cap becomes 250
  //   p5 (100) + p4 (160) = 260 >= 250 -> close {5,4}
  //   p3 + p2 + p1 + p0 = 20+120+80+40 = 260 >= 250 -> close {3,2,1,0}
  std::vector<ParamInfo> params = {
      P("p0", {10}),    P("p1", {4, 5}), P("p2", {30}), P("p3", {5}),
      P("p4", {2, 20}), P("p5", {25}),   P("p6", {70}), P("p7", {3})};
  PlannerOptions options{.first_bucket_cap_bytes = 100,
                         .bucket_cap_bytes = 250};
  auto plan = PlanBuckets(params, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectWellFormed(params, *plan);
  EXPECT_THAT(Indices(*plan), ElementsAre(ElementsAre(7, 6), ElementsAre(5, 4),
                                          ElementsAre(3, 2, 1, 0)));
  EXPECT_THAT(plan->buckets[0].param_offsets, ElementsAre(0, 12));
  EXPECT_THAT(plan->buckets[1].param_offsets, ElementsAre(0, 100));
  EXPECT_THAT(plan->buckets[2].param_offsets, ElementsAre(0, 20, 140, 220));
  EXPECT_EQ(plan->buckets[0].size_bytes, 292u);
  EXPECT_EQ(plan->buckets[1].size_bytes, 260u);
  EXPECT_EQ(plan->buckets[2].size_bytes, 260u);
  EXPECT_EQ(plan->buckets[0].offset, 0u);
  EXPECT_EQ(plan->buckets[1].offset, 512u);   // 292 rounded up to 256
  EXPECT_EQ(plan->buckets[2].offset, 1024u);  // 772 rounded up to 256
  EXPECT_EQ(plan->total_bytes, 4096u);
}

TEST(BucketPlannerTest, MixedDtypesGetSeparateBucketsAndOwnCapLists) {
  // Reverse order, caps [100, 200], one open bucket and one cap list per
  // dtype:
  //   f (bf16, 8)   -> bf16 open {f}
  //   e (f32, 200)  -> 200 >= 100: close {e}; f32 cap now 200
  //   d (f16, 100)  -> 100 >= 100: close {d}; f16 cap now 200 (its own
  //                    first bucket also gets the first cap)
  //   c (f32, 80)   -> f32 open {c}
  //   b (f16, 60)   -> f16 open {b}
  //   a (f32, 40)   -> f32 open {c, a}: 120 < 200
  // Leftovers appended, then everything sorted by first reverse position:
  //   {f}@0 {e}@1 {d}@2 {c,a}@3 {b}@4
  std::vector<ParamInfo> params = {
      P("a", {10}, DType::kFloat32), P("b", {30}, DType::kFloat16),
      P("c", {20}, DType::kFloat32), P("d", {50}, DType::kFloat16),
      P("e", {50}, DType::kFloat32), P("f", {4}, DType::kBFloat16)};
  PlannerOptions options{.first_bucket_cap_bytes = 100,
                         .bucket_cap_bytes = 200};
  auto plan = PlanBuckets(params, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectWellFormed(params, *plan);
  EXPECT_THAT(Indices(*plan),
              ElementsAre(ElementsAre(5), ElementsAre(4), ElementsAre(3),
                          ElementsAre(2, 0), ElementsAre(1)));
  EXPECT_EQ(plan->buckets[0].dtype, DType::kBFloat16);
  EXPECT_EQ(plan->buckets[1].dtype, DType::kFloat32);
  EXPECT_EQ(plan->buckets[2].dtype, DType::kFloat16);
  EXPECT_EQ(plan->buckets[3].dtype, DType::kFloat32);
  EXPECT_EQ(plan->buckets[4].dtype, DType::kFloat16);
}

TEST(BucketPlannerTest, DefaultCapsFirstBucketOneMibThenTwentyFive) {
  // 200 float32 parameters of 256 KiB: 4 fill the 1 MiB first bucket, 100
  // fill a 25 MiB bucket, the last 96 stay in the open bucket.
  std::vector<ParamInfo> params;
  for (int i = 0; i < 200; ++i) {
    params.push_back(P(absl::StrCat("w", i), {256, 256}));
  }
  auto plan = PlanBuckets(params, PlannerOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectWellFormed(params, *plan);
  ASSERT_EQ(plan->buckets.size(), 3u);
  EXPECT_EQ(plan->buckets[0].size_bytes, size_t{1} << 20);
  EXPECT_EQ(plan->buckets[1].size_bytes, size_t{25} << 20);
  EXPECT_EQ(plan->buckets[2].size_bytes, size_t{24} << 20);
  EXPECT_EQ(plan->buckets[0].params.front(), 199);
  EXPECT_EQ(plan->buckets[0].params.back(), 196);
  EXPECT_EQ(plan->buckets[2].params.back(), 0);
  EXPECT_EQ(plan->total_bytes, size_t{50} << 20);
}

TEST(BucketPlannerTest, OversizeParameterClosesItsBucket) {
  // Reverse order: big (30 MiB) alone hits the 1 MiB first cap; mid (1 MiB)
  // opens the next bucket, big2 (30 MiB) pushes it past 25 MiB and closes
  // it, so s0 starts a new one. As in DDP, an oversize parameter shares a
  // bucket only with those before it, never with those after.
  std::vector<ParamInfo> params = {P("s0", {256}), P("big2", {30, 1 << 18}),
                                   P("mid", {1 << 18}),
                                   P("big", {30, 1 << 18})};
  auto plan = PlanBuckets(params, PlannerOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectWellFormed(params, *plan);
  EXPECT_THAT(Indices(*plan),
              ElementsAre(ElementsAre(3), ElementsAre(2, 1), ElementsAre(0)));
  EXPECT_EQ(plan->buckets[0].size_bytes, size_t{30} << 20);
}

TEST(BucketPlannerTest, ParameterLargerThanCapAfterClosedBucketIsAlone) {
  std::vector<ParamInfo> params = {P("huge", {40 << 18}), P("head", {1 << 18})};
  auto plan = PlanBuckets(params, PlannerOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectWellFormed(params, *plan);
  // head (1 MiB) closes the first bucket; huge (40 MiB) is alone.
  EXPECT_THAT(Indices(*plan), ElementsAre(ElementsAre(1), ElementsAre(0)));
}

TEST(BucketPlannerTest, SingleSmallModelIsOneBucket) {
  std::vector<ParamInfo> params = {P("w", {3, 3}), P("b", {3}),
                                   P("scalar", {})};
  auto plan = PlanBuckets(params, PlannerOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectWellFormed(params, *plan);
  EXPECT_THAT(Indices(*plan), ElementsAre(ElementsAre(2, 1, 0)));
  EXPECT_EQ(plan->buckets[0].size_bytes, 4u * (9 + 3 + 1));
  EXPECT_THAT(plan->buckets[0].param_offsets, ElementsAre(0, 4, 16));
}

TEST(BucketPlannerTest, ZeroElementParametersStillGetPlaced) {
  std::vector<ParamInfo> params = {P("empty", {0, 7}),
                                   P("x", {2}, DType::kFloat64)};
  auto plan = PlanBuckets(params, PlannerOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectWellFormed(params, *plan);
  EXPECT_EQ(plan->total_bytes, 4096u);
}

TEST(BucketPlannerTest, AlignmentBetweenBucketsOfOddSizes) {
  // Every parameter closes its own bucket (cap 1 byte); sizes are odd
  // multiples of 2 bytes so unaligned ends are common.
  std::vector<ParamInfo> params;
  for (int i = 0; i < 9; ++i) {
    params.push_back(P(absl::StrCat("h", i), {2 * i + 1}, DType::kFloat16));
  }
  PlannerOptions options{.first_bucket_cap_bytes = 1, .bucket_cap_bytes = 1};
  auto plan = PlanBuckets(params, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectWellFormed(params, *plan);
  ASSERT_EQ(plan->buckets.size(), 9u);
  for (size_t i = 0; i < 9; ++i) {
    EXPECT_EQ(plan->buckets[i].offset, 256 * i);
  }
}

TEST(BucketPlannerTest, RejectsBadInput) {
  EXPECT_EQ(PlanBuckets({}, PlannerOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto negative = PlanBuckets({P("fc.weight", {3, -1})}, PlannerOptions{});
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.status().message(), HasSubstr("fc.weight"));
  EXPECT_THAT(negative.status().message(), HasSubstr("-1"));

  auto unnamed = PlanBuckets({P("a", {1}), P("", {1})}, PlannerOptions{});
  EXPECT_EQ(unnamed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unnamed.status().message(), HasSubstr("parameter 1"));

  auto duplicate = PlanBuckets({P("a", {1}), P("a", {2})}, PlannerOptions{});
  EXPECT_EQ(duplicate.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(duplicate.status().message(), HasSubstr("\"a\""));

  auto bad_dtype = PlanBuckets({ParamInfo{"x", {1}, static_cast<DType>(99)}},
                               PlannerOptions{});
  EXPECT_EQ(bad_dtype.status().code(), absl::StatusCode::kInvalidArgument);

  auto overflow = PlanBuckets({P("x", {int64_t{1} << 40, int64_t{1} << 40})},
                              PlannerOptions{});
  EXPECT_EQ(overflow.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BucketPlannerTest, DeterministicAcrossCalls) {
  std::vector<ParamInfo> params;
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                          DType::kFloat64};
  for (int i = 0; i < 50; ++i) {
    params.push_back(
        P(absl::StrCat("p", i), {(i * 37) % 100 + 1, 1000}, dtypes[i % 4]));
  }
  PlannerOptions options{.first_bucket_cap_bytes = 100000,
                         .bucket_cap_bytes = 1000000};
  auto a = PlanBuckets(params, options);
  auto b = PlanBuckets(params, options);
  ASSERT_TRUE(a.ok() && b.ok());
  ExpectWellFormed(params, *a);
  EXPECT_EQ(Indices(*a), Indices(*b));
  // Ready order: first parameters in strictly increasing reverse position.
  for (size_t i = 1; i < a->buckets.size(); ++i) {
    EXPECT_GT(a->buckets[i - 1].params.front(), a->buckets[i].params.front());
  }
}

}  // namespace
}  // namespace gradd
