// Device memory the daemon allocates for a rank's GPU buckets and shares
// with the trainer by file descriptor (cuMem POSIX-fd handles, passed over
// the session socket with SCM_RIGHTS like the memfds; common/session.h).
//
//   DeviceAllocatorInterface   finds a trainer's GPU by UUID and allocates
//   DeviceMemoryInterface      one allocation: the daemon's own address for
//                              kernels / NCCL, and an fd for the trainer
//
// Implementations: common/cuda/cumem_allocator.h (real, CUDA builds with a
// driver), FakeDeviceAllocator (common/fake_device_memory.h: host memfds
// standing in for GPUs, for tests without a device) and
// NoDeviceAllocator (a daemon without CUDA: every call fails with the
// reason). Thread-safe.
#ifndef GRADD_COMMON_DEVICE_MEMORY_H_
#define GRADD_COMMON_DEVICE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/shm.h"

namespace gradd {

// Released (unmapped, freed) on destruction; the trainer's imported
// mapping keeps the physical memory alive until it unmaps too.
class DeviceMemoryInterface {
 public:
  virtual ~DeviceMemoryInterface() = default;
  // The daemon's device address of the allocation's first byte.
  virtual uint64_t address() const = 0;
  // Bytes allocated (the request rounded up to the device's granularity).
  virtual size_t size() const = 0;
  // The daemon's device ordinal.
  virtual int device() const = 0;
  // A fresh fd naming the allocation, for SCM_RIGHTS to the trainer.
  virtual absl::StatusOr<UniqueFd> Export() const = 0;
};

class DeviceAllocatorInterface {
 public:
  virtual ~DeviceAllocatorInterface() = default;
  // The daemon's ordinal of the GPU with this 16-byte UUID.
  // FAILED_PRECONDITION when the daemon has no CUDA driver (or was built
  // without CUDA); NOT_FOUND when the daemon cannot see that GPU (message
  // lists the GPUs it sees).
  virtual absl::StatusOr<int> FindDevice(absl::string_view uuid) = 0;
  // `bytes` (> 0) of device memory on `device`, exportable by fd.
  // RESOURCE_EXHAUSTED when the device is out of memory.
  virtual absl::StatusOr<std::unique_ptr<DeviceMemoryInterface>> Allocate(
      int device, size_t bytes) = 0;
  // cuDriverGetVersion of the daemon's driver (e.g. 13000); 0 = none/unknown.
  virtual int driver_version() const { return 0; }
  // True when address() is host memory the CPU reducers can work on (the
  // fake): the engine then needs no device reducer.
  virtual bool host_addressable() const { return false; }
};

// For a daemon that cannot serve CUDA parameters: every call fails with
// FAILED_PRECONDITION "CUDA parameters but this daemon has no CUDA driver
// (<reason>)".
class NoDeviceAllocator final : public DeviceAllocatorInterface {
 public:
  explicit NoDeviceAllocator(std::string reason) : reason_(std::move(reason)) {}
  absl::StatusOr<int> FindDevice(absl::string_view uuid) override;
  absl::StatusOr<std::unique_ptr<DeviceMemoryInterface>> Allocate(
      int device, size_t bytes) override;

 private:
  absl::Status Error() const;
  std::string reason_;
};

}  // namespace gradd

#endif  // GRADD_COMMON_DEVICE_MEMORY_H_
