#include "common/cuda/owners.h"

#include <cuda.h>

#include "common/cuda/driver.h"
#include "gtest/gtest.h"

namespace gradd::cuda {
namespace {

// A driver table whose context calls count what UseDevice does: the
// primary context's reference count as the driver keeps it.
int g_refs = 0;
int g_retains = 0;
CUcontext g_current = nullptr;
CUcontext const kPrimary = reinterpret_cast<CUcontext>(0x1000);

CUresult FakeDeviceGet(CUdevice* dev, int ordinal) {
  *dev = ordinal;
  return CUDA_SUCCESS;
}
CUresult FakeRetain(CUcontext* ctx, CUdevice) {
  ++g_refs;
  ++g_retains;
  *ctx = kPrimary;
  return CUDA_SUCCESS;
}
CUresult FakeRelease(CUdevice) {
  // The real driver resets the context when this reaches zero.
  --g_refs;
  return CUDA_SUCCESS;
}
CUresult FakeSetCurrent(CUcontext ctx) {
  g_current = ctx;
  return CUDA_SUCCESS;
}

TEST(UseDeviceTest, RetainsThePrimaryContextOnceAndNeverReleasesIt) {
  CudaDriver d;
  d.cuDeviceGet = &FakeDeviceGet;
  d.cuDevicePrimaryCtxRetain = &FakeRetain;
  d.cuDevicePrimaryCtxRelease = &FakeRelease;
  d.cuCtxSetCurrent = &FakeSetCurrent;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(UseDevice(d, 0, "test").ok());
    EXPECT_EQ(g_current, kPrimary);
    // Had the count dropped to zero the driver would have reset the
    // context, freeing everything in it.
    EXPECT_EQ(g_refs, 1) << "call " << i;
  }
  EXPECT_EQ(g_retains, 1);
  g_current = nullptr;
  ASSERT_TRUE(UseDevice(d, 1, "test").ok());
  EXPECT_EQ(g_current, kPrimary);
  EXPECT_EQ(g_retains, 2);  // one per device
}

}  // namespace
}  // namespace gradd::cuda
