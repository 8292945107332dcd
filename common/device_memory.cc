#include "common/device_memory.h"

#include "absl/strings/str_cat.h"

namespace gradd {

absl::Status NoDeviceAllocator::Error() const {
  return absl::FailedPreconditionError(absl::StrCat(
      "CUDA parameters but this daemon has no CUDA driver (", reason_, ")"));
}

absl::StatusOr<int> NoDeviceAllocator::FindDevice(absl::string_view) {
  return Error();
}

absl::StatusOr<std::unique_ptr<DeviceMemoryInterface>>
NoDeviceAllocator::Allocate(int, size_t) {
  return Error();
}

}  // namespace gradd
