// The daemon's device allocator (common/device_memory.h): cuMem on the
// driver when gradd was built with CUDA and libcuda.so.1 loads; otherwise a
// NoDeviceAllocator whose errors say why, so CPU jobs run unchanged and a
// CUDA attach gets a clear FAILED_PRECONDITION.
#ifndef GRADD_SERVER_DEVICE_ALLOCATOR_H_
#define GRADD_SERVER_DEVICE_ALLOCATOR_H_

#include <memory>

#include "common/device_memory.h"

namespace gradd {

std::unique_ptr<DeviceAllocatorInterface> MakeDeviceAllocator();

}  // namespace gradd

#endif  // GRADD_SERVER_DEVICE_ALLOCATOR_H_
