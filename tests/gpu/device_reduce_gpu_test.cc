// The device reducers and cuMem memory on a real GPU (ctest label gpu;
// skipped without a driver or device): every element of the fused average
// matches the CPU reducer's bits for fp32, fp64, fp16 and bf16, and memory
// exported by fd imports into a second mapping that sees the same bytes.
#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/cuda/cumem_allocator.h"
#include "common/cuda/device_reduce.h"
#include "common/cuda/driver.h"
#include "common/dtype.h"
#include "common/reduce.h"
#include "gtest/gtest.h"

namespace gradd::cuda {
namespace {

class DeviceReduceGpuTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    absl::StatusOr<const CudaDriver*> d = CudaDriver::Get();
    if (!d.ok()) GTEST_SKIP() << "no GPU: " << d.status();
    driver_ = *d;
    absl::StatusOr<std::unique_ptr<DeviceAllocatorInterface>> a =
        CuMemAllocator::Create();
    ASSERT_TRUE(a.ok()) << a.status();
    allocator_ = *std::move(a);
    int count = 0;
    ASSERT_EQ(driver_->cuDeviceGetCount(&count), CUDA_SUCCESS);
    if (count == 0) GTEST_SKIP() << "no GPU";
  }

  // Random values exactly representable in every dtype (small integers
  // over powers of two), so the CPU reference is unambiguous.
  std::vector<uint8_t> Fill(DType dtype, size_t count, int seed) {
    std::mt19937 gen(seed);
    std::uniform_int_distribution<int> dist(-64, 64);
    std::vector<uint8_t> bytes(count * DTypeSize(dtype));
    for (size_t i = 0; i < count; ++i) {
      const float v = dist(gen) / 8.0f;
      switch (dtype) {
        case DType::kFloat32:
          std::memcpy(&bytes[i * 4], &v, 4);
          break;
        case DType::kFloat64: {
          const double d = v;
          std::memcpy(&bytes[i * 8], &d, 8);
          break;
        }
        case DType::kFloat16: {
          const uint16_t h = FloatToHalf(v);
          std::memcpy(&bytes[i * 2], &h, 2);
          break;
        }
        case DType::kBFloat16: {
          const uint16_t h = FloatToBFloat16(v);
          std::memcpy(&bytes[i * 2], &h, 2);
          break;
        }
      }
    }
    return bytes;
  }

  const CudaDriver* driver_ = nullptr;
  std::unique_ptr<DeviceAllocatorInterface> allocator_;
};

TEST_P(DeviceReduceGpuTest, FusedAverageMatchesTheCpuBitForBit) {
  const DType dtype = GetParam();
  const int n = 3;
  // Not a multiple of the vector width: the scalar tail runs too.
  const size_t count = (1 << 20) + 7;
  const size_t bytes = count * DTypeSize(dtype);
  std::vector<std::unique_ptr<DeviceMemoryInterface>> mem;
  std::vector<std::vector<uint8_t>> host;
  std::vector<void*> dev, cpu;
  for (int k = 0; k < n; ++k) {
    absl::StatusOr<std::unique_ptr<DeviceMemoryInterface>> m =
        allocator_->Allocate(0, bytes);
    ASSERT_TRUE(m.ok()) << m.status();
    host.push_back(Fill(dtype, count, k + 1));
    ASSERT_EQ(
        driver_->cuMemcpyAsync(
            (*m)->address(), reinterpret_cast<CUdeviceptr>(host.back().data()),
            bytes, nullptr),
        CUDA_SUCCESS);
    dev.push_back(reinterpret_cast<void*>((*m)->address()));
    mem.push_back(*std::move(m));
  }
  for (auto& h : host) cpu.push_back(h.data());
  ASSERT_TRUE(
      DeviceFusedAverage(dtype, dev.data(), n, count, n, nullptr, "test").ok());
  ASSERT_EQ(driver_->cuStreamSynchronize(nullptr), CUDA_SUCCESS);
  FusedAverage(dtype, cpu.data(), n, 0, count, n);
  for (int k = 0; k < n; ++k) {
    std::vector<uint8_t> back(bytes);
    ASSERT_EQ(driver_->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(back.data()),
                                     mem[k]->address(), bytes, nullptr),
              CUDA_SUCCESS);
    ASSERT_EQ(driver_->cuStreamSynchronize(nullptr), CUDA_SUCCESS);
    ASSERT_EQ(std::memcmp(back.data(), host[0].data(), bytes), 0)
        << "buffer " << k << " differs from the CPU reducer";
  }
}

TEST_P(DeviceReduceGpuTest, ExportedMemoryImportsToTheSameBytes) {
  const DType dtype = GetParam();
  const size_t count = 4096;
  const size_t bytes = count * DTypeSize(dtype);
  absl::StatusOr<std::unique_ptr<DeviceMemoryInterface>> m =
      allocator_->Allocate(0, bytes);
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<uint8_t> values = Fill(dtype, count, 7);
  ASSERT_EQ(driver_->cuMemcpyAsync((*m)->address(),
                                   reinterpret_cast<CUdeviceptr>(values.data()),
                                   bytes, nullptr),
            CUDA_SUCCESS);
  absl::StatusOr<UniqueFd> fd = (*m)->Export();
  ASSERT_TRUE(fd.ok()) << fd.status();
  absl::StatusOr<ImportedDeviceMemory> imported =
      ImportedDeviceMemory::Import(driver_, *std::move(fd), 0, (*m)->size());
  ASSERT_TRUE(imported.ok()) << imported.status();
  std::vector<uint8_t> back(bytes);
  ASSERT_EQ(driver_->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(back.data()),
                                   imported->address(), bytes, nullptr),
            CUDA_SUCCESS);
  ASSERT_EQ(driver_->cuStreamSynchronize(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(back, values);
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, DeviceReduceGpuTest,
                         ::testing::Values(DType::kFloat32, DType::kFloat64,
                                           DType::kFloat16, DType::kBFloat16),
                         [](const auto& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace gradd::cuda
