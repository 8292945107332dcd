// The run-time-loaded driver, on machines with or without one: a missing
// library is a clear FAILED_PRECONDITION, CUresults map to canonical codes,
// and the daemon's allocator says why it cannot serve CUDA.
#include "common/cuda/driver.h"

#include "common/cuda/cumem_allocator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/device_allocator.h"

namespace gradd::cuda {
namespace {

using ::testing::HasSubstr;

TEST(CudaDriverTest, MissingLibraryIsAClearError) {
  absl::StatusOr<CudaDriver> d = CudaDriver::Load("libgradd-no-such-cuda.so.1");
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(d.status().message(),
              HasSubstr("no CUDA driver on this machine: cannot load "
                        "libgradd-no-such-cuda.so.1"));
}

TEST(CudaDriverTest, ResultCodes) {
  EXPECT_EQ(CuStatusCode(CUDA_SUCCESS), absl::StatusCode::kOk);
  EXPECT_EQ(CuStatusCode(CUDA_ERROR_OUT_OF_MEMORY),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CuStatusCode(CUDA_ERROR_INVALID_VALUE),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CuStatusCode(CUDA_ERROR_ILLEGAL_ADDRESS),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(CuStatusCode(CUDA_ERROR_UNKNOWN), absl::StatusCode::kInternal);
}

TEST(CudaDriverTest, CheckNamesContextWithoutADriverTable) {
  CudaDriver empty;  // no driver: no cuGetErrorName, the number is printed
  absl::Status s = CuCheck(empty, CUDA_ERROR_OUT_OF_MEMORY,
                           "job 'j' rank 1 device 0 bucket 3: cuMemCreate");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(),
              HasSubstr("job 'j' rank 1 device 0 bucket 3: cuMemCreate: "
                        "CUresult 2"));
  EXPECT_TRUE(CuCheck(empty, CUDA_SUCCESS, "x").ok());
}

// Either branch asserts: with a driver the process table loads and the
// allocator is the real one; without, both say there is no driver.
TEST(CudaDriverTest, ProcessTableAndDaemonAllocatorAgree) {
  absl::StatusOr<const CudaDriver*> d = CudaDriver::Get();
  absl::StatusOr<std::unique_ptr<DeviceAllocatorInterface>> real =
      CuMemAllocator::Create();
  std::unique_ptr<DeviceAllocatorInterface> daemon = MakeDeviceAllocator();
  if (d.ok()) {
    EXPECT_GE((*d)->version, kMinDriverVersion);
    EXPECT_TRUE(real.ok()) << real.status();
  } else {
    EXPECT_FALSE(real.ok());
    absl::StatusOr<int> found = daemon->FindDevice(std::string(16, '\0'));
    EXPECT_EQ(found.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(
        found.status().message(),
        HasSubstr("CUDA parameters but this daemon has no CUDA driver"));
    EXPECT_THAT(found.status().message(),
                HasSubstr(std::string(d.status().message())));
  }
}

}  // namespace
}  // namespace gradd::cuda
