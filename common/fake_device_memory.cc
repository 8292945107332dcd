#include "common/fake_device_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/device.h"
#include "common/status_macros.h"

namespace gradd {

class FakeDeviceMemory final : public DeviceMemoryInterface {
 public:
  FakeDeviceMemory(FakeDeviceAllocator* owner, int device, UniqueFd fd,
                   Mapping mapping)
      : owner_(owner),
        device_(device),
        fd_(std::move(fd)),
        mapping_(std::move(mapping)) {}
  ~FakeDeviceMemory() override {
    absl::MutexLock lock(&owner_->mu_);
    --owner_->live_;
  }

  uint64_t address() const override {
    return reinterpret_cast<uintptr_t>(mapping_.data());
  }
  size_t size() const override { return mapping_.size(); }
  int device() const override { return device_; }
  absl::StatusOr<UniqueFd> Export() const override {
    int fd = ::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
      return absl::ResourceExhaustedError("fake device memory: dup failed");
    }
    return UniqueFd(fd);
  }

 private:
  FakeDeviceAllocator* owner_;
  int device_;
  UniqueFd fd_;
  Mapping mapping_;
};

absl::StatusOr<int> FakeDeviceAllocator::FindDevice(absl::string_view uuid) {
  for (size_t i = 0; i < uuids_.size(); ++i) {
    if (uuids_[i] == uuid) return static_cast<int>(i);
  }
  return absl::NotFoundError(absl::StrCat("GPU ", FormatGpuUuid(uuid),
                                          " is not visible to the daemon (it "
                                          "sees ",
                                          uuids_.size(), " fake GPUs)"));
}

absl::StatusOr<std::unique_ptr<DeviceMemoryInterface>>
FakeDeviceAllocator::Allocate(int device, size_t bytes) {
  if (device < 0 || static_cast<size_t>(device) >= uuids_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", device, " is out of range"));
  }
  if (bytes == 0) {
    return absl::InvalidArgumentError("a device allocation of 0 bytes");
  }
  {
    absl::MutexLock lock(&mu_);
    if (fail_next_) {
      fail_next_ = false;
      return absl::ResourceExhaustedError(absl::StrCat(
          "device ", device, ": out of memory allocating ", bytes, " bytes"));
    }
  }
  // The granularity of the real allocator (2 MiB on H100/H200) would make
  // tests slow for nothing; pages are enough to exercise rounding.
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t size = (bytes + page - 1) / page * page;
  ASSIGN_OR_RETURN(UniqueFd fd, CreateSealedMemfd("gradd-fake-device", size));
  ASSIGN_OR_RETURN(Mapping mapping, Mapping::Map(fd.get(), size));
  {
    absl::MutexLock lock(&mu_);
    ++live_;
  }
  return std::unique_ptr<DeviceMemoryInterface>(
      new FakeDeviceMemory(this, device, std::move(fd), std::move(mapping)));
}

int FakeDeviceAllocator::live_allocations() const {
  absl::MutexLock lock(&mu_);
  return live_;
}

void FakeDeviceAllocator::FailNextAllocation() {
  absl::MutexLock lock(&mu_);
  fail_next_ = true;
}

}  // namespace gradd
