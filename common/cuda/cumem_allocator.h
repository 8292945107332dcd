// DeviceAllocatorInterface on the CUDA driver's virtual memory API: each
// allocation is cuMemCreate'd with POSIX file-descriptor handles, mapped
// into the daemon (read-write for its device) and exported with
// cuMemExportToShareableHandle for the trainer, which imports it with
// ImportDeviceMemory (same header) and maps it once.
//
// Create() fails (FAILED_PRECONDITION / UNAVAILABLE, from CudaDriver::Get)
// without a usable driver; FindDevice matches UUIDs against every device
// the daemon sees. Thread-safe: the driver is, and the allocator keeps no
// mutable state after Create.
#ifndef GRADD_COMMON_CUDA_CUMEM_ALLOCATOR_H_
#define GRADD_COMMON_CUDA_CUMEM_ALLOCATOR_H_

#include <cuda.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda/driver.h"
#include "common/device_memory.h"

namespace gradd::cuda {

class CuMemAllocator final : public DeviceAllocatorInterface {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceAllocatorInterface>> Create();

  absl::StatusOr<int> FindDevice(absl::string_view uuid) override;
  absl::StatusOr<std::unique_ptr<DeviceMemoryInterface>> Allocate(
      int device, size_t bytes) override;
  int driver_version() const override { return driver_->version; }

 private:
  struct Gpu {
    CUdevice device = 0;
    std::string uuid;  // 16 raw bytes
    bool fd_handles = false;
  };
  CuMemAllocator(const CudaDriver* driver, std::vector<Gpu> gpus)
      : driver_(driver), gpus_(std::move(gpus)) {}

  const CudaDriver* driver_;
  std::vector<Gpu> gpus_;
};

// A mapping of memory another process exported (CuMemAllocator's fd), in
// this process, read-write for `device` (the importer's ordinal). Unmapped
// and released on destruction; the fd is consumed (closed) either way.
class ImportedDeviceMemory {
 public:
  static absl::StatusOr<ImportedDeviceMemory> Import(const CudaDriver* driver,
                                                     UniqueFd fd, int device,
                                                     size_t bytes);
  ImportedDeviceMemory(ImportedDeviceMemory&& other) noexcept;
  ImportedDeviceMemory& operator=(ImportedDeviceMemory&& other) noexcept;
  ImportedDeviceMemory(const ImportedDeviceMemory&) = delete;
  ImportedDeviceMemory& operator=(const ImportedDeviceMemory&) = delete;
  ~ImportedDeviceMemory();

  CUdeviceptr address() const { return address_; }
  size_t size() const { return size_; }

 private:
  ImportedDeviceMemory() = default;
  void Reset();
  const CudaDriver* driver_ = nullptr;
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr address_ = 0;
  size_t size_ = 0;
  bool mapped_ = false;
};

}  // namespace gradd::cuda

#endif  // GRADD_COMMON_CUDA_CUMEM_ALLOCATOR_H_
