// The collective kernels (common/collective_reduce.h): every dtype and op,
// integer wrap-around, 16-bit accumulation in float32, validation.
#include "common/collective_reduce.h"

#include <cstdint>
#include <vector>

#include "common/reduce.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

TEST(CollectiveReduceTest, ValidatesDTypesAndOps) {
  for (int v = 1; v <= 8; ++v) EXPECT_TRUE(CollectiveDTypeFromInt(v).ok());
  EXPECT_THAT(CollectiveDTypeFromInt(0).status().message(),
              HasSubstr("unknown collective dtype 0"));
  EXPECT_FALSE(CollectiveDTypeFromInt(9).ok());
  EXPECT_FALSE(CollectiveOpFromInt(-1).ok());
  EXPECT_FALSE(CollectiveOpFromInt(4).ok());
  EXPECT_EQ(CollectiveDTypeSize(CollectiveDType::kInt64), 8u);
  EXPECT_EQ(CollectiveDTypeSize(CollectiveDType::kBFloat16), 2u);
  EXPECT_EQ(CollectiveDTypeSize(CollectiveDType::kInt8), 1u);
  EXPECT_TRUE(
      CheckReduction(CollectiveDType::kFloat16, CollectiveOp::kAvg).ok());
  const absl::Status s =
      CheckReduction(CollectiveDType::kInt32, CollectiveOp::kAvg);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("avg is not supported for int32"));
  EXPECT_TRUE(CheckReduction(CollectiveDType::kUInt8, CollectiveOp::kMax).ok());
}

template <typename T>
std::vector<T> ReduceThree(CollectiveDType dtype, CollectiveOp op,
                           std::vector<T> a, std::vector<T> b,
                           std::vector<T> c) {
  const void* srcs[] = {a.data(), b.data(), c.data()};
  // In place into the first source, as the daemon does.
  ReduceToAccumulator(dtype, op, srcs, 3, a.data(), 0, a.size());
  void* dsts[] = {a.data()};
  WriteFromAccumulator(dtype, op, a.data(), 3, dsts, 1, 0, a.size());
  return a;
}

TEST(CollectiveReduceTest, IntegerSumMinMaxExactly) {
  using V = std::vector<int32_t>;
  EXPECT_EQ(ReduceThree<int32_t>(CollectiveDType::kInt32, CollectiveOp::kSum,
                                 V{1, -5, 2000000000}, V{2, 5, 100000000},
                                 V{3, 7, 0}),
            (V{6, 7, 2100000000}));
  EXPECT_EQ(ReduceThree<int32_t>(CollectiveDType::kInt32, CollectiveOp::kMin,
                                 V{1, -5, 9}, V{2, 5, -9}, V{0, 7, 9}),
            (V{0, -5, -9}));
  using L = std::vector<int64_t>;
  EXPECT_EQ(ReduceThree<int64_t>(CollectiveDType::kInt64, CollectiveOp::kMax,
                                 L{int64_t{1} << 50, -1}, L{3, -2},
                                 L{(int64_t{1} << 50) + 1, -3}),
            (L{(int64_t{1} << 50) + 1, -1}));
  // Sums wrap like torch's integer tensors instead of being undefined.
  using I8 = std::vector<int8_t>;
  EXPECT_EQ(ReduceThree<int8_t>(CollectiveDType::kInt8, CollectiveOp::kSum,
                                I8{100, -100}, I8{100, -100}, I8{0, 0}),
            (I8{-56, 56}));
  using U8 = std::vector<uint8_t>;
  EXPECT_EQ(ReduceThree<uint8_t>(CollectiveDType::kUInt8, CollectiveOp::kMax,
                                 U8{1, 255}, U8{200, 0}, U8{3, 4}),
            (U8{200, 255}));
}

TEST(CollectiveReduceTest, FloatAverageDividesByTheDivisor) {
  using F = std::vector<float>;
  EXPECT_EQ(ReduceThree<float>(CollectiveDType::kFloat32, CollectiveOp::kAvg,
                               F{1, 3}, F{2, 3}, F{3, -3}),
            (F{2, 1}));
  using D = std::vector<double>;
  EXPECT_EQ(ReduceThree<double>(CollectiveDType::kFloat64, CollectiveOp::kMin,
                                D{1.5, 3}, D{-2, 3}, D{3, -3.25}),
            (D{-2, -3.25}));
}

TEST(CollectiveReduceTest, SixteenBitTypesAccumulateInFloat32) {
  // 2048 + 1 + 1 is 2050 in float32 but 2048 when every addition rounds to
  // float16 (spacing 2 above 2048): one rounding at the end keeps it.
  for (auto [dtype, to16, from16] :
       {std::tuple{CollectiveDType::kFloat16, &FloatToHalf, &HalfToFloat}}) {
    std::vector<uint16_t> a = {to16(2048), to16(-1)};
    std::vector<uint16_t> b = {to16(1), to16(4)};
    std::vector<uint16_t> c = {to16(1), to16(-8)};
    const void* srcs[] = {a.data(), b.data(), c.data()};
    std::vector<float> acc(2);
    ReduceToAccumulator(dtype, CollectiveOp::kSum, srcs, 3, acc.data(), 0, 2);
    EXPECT_EQ(acc[0], 2050.0f);
    std::vector<uint16_t> out(2);
    void* dsts[] = {out.data()};
    WriteFromAccumulator(dtype, CollectiveOp::kSum, acc.data(), 3, dsts, 1, 0,
                         2);
    EXPECT_EQ(from16(out[0]), 2050.0f);
    EXPECT_EQ(from16(out[1]), -5.0f);
    ReduceToAccumulator(dtype, CollectiveOp::kMax, srcs, 3, acc.data(), 0, 2);
    EXPECT_EQ(acc[1], 4.0f);
  }
  std::vector<uint16_t> a = {FloatToBFloat16(3)}, b = {FloatToBFloat16(6)};
  const void* srcs[] = {a.data(), b.data()};
  std::vector<float> acc(1);
  ReduceToAccumulator(CollectiveDType::kBFloat16, CollectiveOp::kAvg, srcs, 2,
                      acc.data(), 0, 1);
  std::vector<uint16_t> out(1);
  void* dsts[] = {out.data()};
  WriteFromAccumulator(CollectiveDType::kBFloat16, CollectiveOp::kAvg,
                       acc.data(), 2, dsts, 1, 0, 1);
  EXPECT_EQ(BFloat16ToFloat(out[0]), 4.5f);
}

TEST(CollectiveReduceTest, CombineFunctionsFoldTwoNodes) {
  std::vector<int64_t> x = {5, -7}, y = {-3, 9};
  CombineFunction(CollectiveDType::kInt64, CollectiveOp::kMin)(
      x.data(), x.data(), y.data(), 2);
  EXPECT_EQ(x, (std::vector<int64_t>{-3, -7}));
  std::vector<float> f = {1.5f, 2}, g = {2, -2};
  CombineFunction(CollectiveDType::kFloat32, CollectiveOp::kAvg)(
      f.data(), f.data(), g.data(), 2);
  EXPECT_EQ(f, (std::vector<float>{3.5f, 0}));
  std::vector<uint8_t> u = {250, 1}, v = {10, 2};
  CombineFunction(CollectiveDType::kUInt8, CollectiveOp::kSum)(
      u.data(), u.data(), v.data(), 2);
  EXPECT_EQ(u, (std::vector<uint8_t>{4, 3}));
}

}  // namespace
}  // namespace gradd
