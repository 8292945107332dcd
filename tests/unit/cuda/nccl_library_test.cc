// NCCL loaded at run time: a missing library is a clear error, results map
// to canonical codes, the accumulator types are NCCL's float32/float64.
#include "server/backends/nccl/nccl_library.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd::nccl {
namespace {

using ::testing::HasSubstr;

TEST(NcclLibraryTest, MissingLibraryIsAClearError) {
  absl::StatusOr<NcclLibrary> lib = NcclLibrary::Load("libgradd-no-nccl.so.2");
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(lib.status().message(),
              HasSubstr("NCCL is not available: cannot load "
                        "libgradd-no-nccl.so.2"));
}

// The toolkit's libnccl.so.2 loads without a GPU (it touches the driver
// only when a communicator is made); where it is not on the library path
// the process table says so.
TEST(NcclLibraryTest, ProcessTableLoadsOrSaysWhy) {
  absl::StatusOr<const NcclLibrary*> lib = NcclLibrary::Get();
  if (lib.ok()) {
    EXPECT_GT((*lib)->version, 0);
    EXPECT_THAT(
        std::string(NcclCheck(**lib, ncclInvalidArgument, "job 'j' bucket 2")
                        .message()),
        HasSubstr("job 'j' bucket 2: NCCL error 4 ("));
  } else {
    EXPECT_THAT(lib.status().message(), HasSubstr("libnccl.so.2"));
  }
}

TEST(NcclLibraryTest, CheckCodesWithoutALibrary) {
  NcclLibrary none;
  EXPECT_TRUE(NcclCheck(none, ncclSuccess, "x").ok());
  EXPECT_EQ(NcclCheck(none, ncclRemoteError, "x").code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(NcclCheck(none, ncclInvalidUsage, "x").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclCheck(none, ncclInternalError, "x").code(),
            absl::StatusCode::kInternal);
}

TEST(NcclLibraryTest, AccumulatorTypes) {
  EXPECT_EQ(*NcclType(DType::kFloat32), ncclFloat32);
  EXPECT_EQ(*NcclType(DType::kFloat16), ncclFloat32);
  EXPECT_EQ(*NcclType(DType::kBFloat16), ncclFloat32);
  EXPECT_EQ(*NcclType(DType::kFloat64), ncclFloat64);
}

}  // namespace
}  // namespace gradd::nccl
