#include "common/dtype.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

TEST(DTypeTest, SizesNamesAndAccumulators) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kFloat64), 8u);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(AccumulatorDType(DType::kFloat16), DType::kFloat32);
  EXPECT_EQ(AccumulatorDType(DType::kBFloat16), DType::kFloat32);
  EXPECT_EQ(AccumulatorDType(DType::kFloat64), DType::kFloat64);
}

TEST(DTypeTest, Parsing) {
  EXPECT_EQ(*DTypeFromName("half"), DType::kFloat16);
  EXPECT_EQ(*DTypeFromName("BF16"), DType::kBFloat16);
  EXPECT_EQ(*DTypeFromName("double"), DType::kFloat64);
  EXPECT_EQ(*DTypeFromName("float"), DType::kFloat32);
  EXPECT_EQ(DTypeFromName("int8").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*DTypeFromInt(3), DType::kFloat16);
  EXPECT_EQ(DTypeFromInt(0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DTypeFromInt(5).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradd
