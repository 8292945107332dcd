// FakeDeviceAllocator: DeviceAllocatorInterface without a GPU, for tests of
// the device protocol (attach checks, handle passing over the session
// socket, the device-aware plan). Each "GPU" is a UUID; each allocation is a
// sealed memfd mapped into this process, so Export()'s fd is a real fd the
// peer can map and compare bytes through. Thread-safe.
#ifndef GRADD_COMMON_FAKE_DEVICE_MEMORY_H_
#define GRADD_COMMON_FAKE_DEVICE_MEMORY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/device_memory.h"

namespace gradd {

class FakeDeviceAllocator final : public DeviceAllocatorInterface {
 public:
  // One fake GPU per UUID (16 bytes each), ordinals in list order.
  explicit FakeDeviceAllocator(std::vector<std::string> uuids,
                               int driver_version = 13000)
      : uuids_(std::move(uuids)), driver_version_(driver_version) {}

  absl::StatusOr<int> FindDevice(absl::string_view uuid) override;
  absl::StatusOr<std::unique_ptr<DeviceMemoryInterface>> Allocate(
      int device, size_t bytes) override;
  int driver_version() const override { return driver_version_; }
  bool host_addressable() const override { return true; }

  // Allocations made and still alive.
  int live_allocations() const;
  // The next Allocate fails with RESOURCE_EXHAUSTED (a full device).
  void FailNextAllocation();

 private:
  friend class FakeDeviceMemory;
  std::vector<std::string> uuids_;
  int driver_version_;
  mutable absl::Mutex mu_;
  int live_ ABSL_GUARDED_BY(mu_) = 0;
  bool fail_next_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gradd

#endif  // GRADD_COMMON_FAKE_DEVICE_MEMORY_H_
