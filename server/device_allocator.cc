#include "server/device_allocator.h"

#include <string>

#if GRADD_HAVE_CUDA
#include "common/cuda/cumem_allocator.h"
#endif

namespace gradd {

std::unique_ptr<DeviceAllocatorInterface> MakeDeviceAllocator() {
#if GRADD_HAVE_CUDA
  absl::StatusOr<std::unique_ptr<DeviceAllocatorInterface>> real =
      cuda::CuMemAllocator::Create();
  if (real.ok()) return *std::move(real);
  return std::make_unique<NoDeviceAllocator>(
      std::string(real.status().message()));
#else
  return std::make_unique<NoDeviceAllocator>("gradd was built without CUDA");
#endif
}

}  // namespace gradd
