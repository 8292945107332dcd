#include "common/cuda/cumem_allocator.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/device.h"
#include "common/status_macros.h"

namespace gradd::cuda {
namespace {

CUmemAllocationProp PropFor(CUdevice device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// Makes `device`'s primary context current on this thread (the cuMem calls
// and the mapping need one); the retain is balanced by the context's owner
// (the driver keeps primary contexts until process exit for us).
absl::Status UseDeviceHandle(const CudaDriver& d, CUdevice device,
                             absl::string_view who) {
  CUcontext ctx = nullptr;
  RETURN_IF_ERROR(CuCheck(d, d.cuDevicePrimaryCtxRetain(&ctx, device),
                          absl::StrCat(who, ": cuDevicePrimaryCtxRetain")));
  return CuCheck(d, d.cuCtxSetCurrent(ctx),
                 absl::StrCat(who, ": cuCtxSetCurrent"));
}

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// A mapped allocation; the pieces are undone in reverse order by Release.
struct Pieces {
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr address = 0;
  size_t size = 0;
  bool reserved = false;
  bool mapped = false;
};

void Release(const CudaDriver& d, Pieces& p) {
  if (p.mapped) d.cuMemUnmap(p.address, p.size);
  if (p.reserved) d.cuMemAddressFree(p.address, p.size);
  if (p.handle != 0) d.cuMemRelease(p.handle);
  p = Pieces{};
}

// Reserves address space for `p.handle`, maps it and grants `device`
// read-write access.
absl::Status MapHandle(const CudaDriver& d, CUdevice device, Pieces& p,
                       absl::string_view who) {
  RETURN_IF_ERROR(CuCheck(d, d.cuMemAddressReserve(&p.address, p.size, 0, 0, 0),
                          absl::StrCat(who, ": cuMemAddressReserve")));
  p.reserved = true;
  RETURN_IF_ERROR(CuCheck(d, d.cuMemMap(p.address, p.size, 0, p.handle, 0),
                          absl::StrCat(who, ": cuMemMap")));
  p.mapped = true;
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return CuCheck(d, d.cuMemSetAccess(p.address, p.size, &access, 1),
                 absl::StrCat(who, ": cuMemSetAccess"));
}

class CuMemAllocation final : public DeviceMemoryInterface {
 public:
  CuMemAllocation(const CudaDriver* driver, int device, Pieces pieces)
      : driver_(driver), device_(device), pieces_(pieces) {}
  ~CuMemAllocation() override { Release(*driver_, pieces_); }

  uint64_t address() const override { return pieces_.address; }
  size_t size() const override { return pieces_.size; }
  int device() const override { return device_; }
  absl::StatusOr<UniqueFd> Export() const override {
    int fd = -1;
    RETURN_IF_ERROR(CuCheck(
        *driver_,
        driver_->cuMemExportToShareableHandle(
            &fd, pieces_.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        absl::StrCat("device ", device_, ": cuMemExportToShareableHandle")));
    return UniqueFd(fd);
  }

 private:
  const CudaDriver* driver_;
  int device_;
  Pieces pieces_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceAllocatorInterface>>
CuMemAllocator::Create() {
  ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  int count = 0;
  RETURN_IF_ERROR(CuCheck(*d, d->cuDeviceGetCount(&count), "cuDeviceGetCount"));
  std::vector<Gpu> gpus;
  for (int i = 0; i < count; ++i) {
    Gpu gpu;
    RETURN_IF_ERROR(CuCheck(*d, d->cuDeviceGet(&gpu.device, i),
                            absl::StrCat("device ", i, ": cuDeviceGet")));
    CUuuid uuid;
    RETURN_IF_ERROR(CuCheck(*d, d->cuDeviceGetUuid(&uuid, gpu.device),
                            absl::StrCat("device ", i, ": cuDeviceGetUuid")));
    gpu.uuid.assign(uuid.bytes, sizeof(uuid.bytes));
    int fd_ok = 0;
    RETURN_IF_ERROR(CuCheck(
        *d,
        d->cuDeviceGetAttribute(
            &fd_ok,
            CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            gpu.device),
        absl::StrCat("device ", i, ": cuDeviceGetAttribute")));
    gpu.fd_handles = fd_ok != 0;
    gpus.push_back(std::move(gpu));
  }
  return std::unique_ptr<DeviceAllocatorInterface>(
      new CuMemAllocator(d, std::move(gpus)));
}

absl::StatusOr<int> CuMemAllocator::FindDevice(absl::string_view uuid) {
  std::vector<std::string> seen;
  for (size_t i = 0; i < gpus_.size(); ++i) {
    if (gpus_[i].uuid == uuid) {
      if (!gpus_[i].fd_handles) {
        return absl::FailedPreconditionError(absl::StrCat(
            "GPU ", FormatGpuUuid(uuid), " (the daemon's device ", i,
            ") cannot export memory as POSIX file descriptors"));
      }
      return static_cast<int>(i);
    }
    seen.push_back(absl::StrCat(i, ": ", FormatGpuUuid(gpus_[i].uuid)));
  }
  return absl::NotFoundError(absl::StrCat(
      "GPU ", FormatGpuUuid(uuid), " is not visible to the daemon (it sees ",
      seen.empty() ? "no GPUs" : absl::StrJoin(seen, ", "),
      "; check CUDA_VISIBLE_DEVICES and the container's devices)"));
}

absl::StatusOr<std::unique_ptr<DeviceMemoryInterface>> CuMemAllocator::Allocate(
    int device, size_t bytes) {
  if (device < 0 || static_cast<size_t>(device) >= gpus_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", device, " is out of range (the daemon sees ",
                     gpus_.size(), " GPUs)"));
  }
  if (bytes == 0) {
    return absl::InvalidArgumentError("a device allocation of 0 bytes");
  }
  const std::string who = absl::StrCat("device ", device);
  const CudaDriver& d = *driver_;
  const CUdevice dev = gpus_[device].device;
  RETURN_IF_ERROR(UseDeviceHandle(d, dev, who));
  CUmemAllocationProp prop = PropFor(dev);
  size_t granularity = 0;
  RETURN_IF_ERROR(
      CuCheck(d,
              d.cuMemGetAllocationGranularity(
                  &granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
              absl::StrCat(who, ": cuMemGetAllocationGranularity")));
  Pieces p;
  p.size = RoundUp(bytes, granularity == 0 ? 2 << 20 : granularity);
  absl::Status s =
      CuCheck(d, d.cuMemCreate(&p.handle, p.size, &prop, 0),
              absl::StrCat(who, ": cuMemCreate of ", p.size, " bytes"));
  if (s.ok()) s = MapHandle(d, dev, p, who);
  if (s.ok()) {
    // Gradients start at zero, as a fresh memfd does.
    s = CuCheck(d, d.cuMemsetD8Async(p.address, 0, p.size, nullptr),
                absl::StrCat(who, ": cuMemsetD8Async"));
  }
  if (s.ok()) {
    // Nothing orders the trainer's writes (another process, its own
    // streams) after our stream: the zeros land before the memory is
    // exported.
    s = CuCheck(d, d.cuStreamSynchronize(nullptr),
                absl::StrCat(who, ": cuStreamSynchronize"));
  }
  if (!s.ok()) {
    Release(d, p);
    return s;
  }
  return std::unique_ptr<DeviceMemoryInterface>(
      new CuMemAllocation(driver_, device, p));
}

absl::StatusOr<ImportedDeviceMemory> ImportedDeviceMemory::Import(
    const CudaDriver* driver, UniqueFd fd, int device, size_t bytes) {
  const CudaDriver& d = *driver;
  const std::string who = absl::StrCat("device ", device, " (import)");
  CUdevice dev = 0;
  RETURN_IF_ERROR(CuCheck(d, d.cuDeviceGet(&dev, device),
                          absl::StrCat(who, ": cuDeviceGet")));
  RETURN_IF_ERROR(UseDeviceHandle(d, dev, who));
  ImportedDeviceMemory m;
  m.driver_ = driver;
  Pieces p;
  p.size = bytes;
  // The driver takes the fd's value, not ownership: we close it after.
  RETURN_IF_ERROR(CuCheck(
      d,
      d.cuMemImportFromShareableHandle(
          &p.handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
      absl::StrCat(who, ": cuMemImportFromShareableHandle")));
  absl::Status s = MapHandle(d, dev, p, who);
  if (!s.ok()) {
    Release(d, p);
    return s;
  }
  m.handle_ = p.handle;
  m.address_ = p.address;
  m.size_ = p.size;
  m.mapped_ = true;
  return m;
}

ImportedDeviceMemory::ImportedDeviceMemory(
    ImportedDeviceMemory&& other) noexcept
    : driver_(other.driver_),
      handle_(std::exchange(other.handle_, 0)),
      address_(std::exchange(other.address_, 0)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, false)) {}

ImportedDeviceMemory& ImportedDeviceMemory::operator=(
    ImportedDeviceMemory&& other) noexcept {
  if (this != &other) {
    Reset();
    driver_ = other.driver_;
    handle_ = std::exchange(other.handle_, 0);
    address_ = std::exchange(other.address_, 0);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, false);
  }
  return *this;
}

ImportedDeviceMemory::~ImportedDeviceMemory() { Reset(); }

void ImportedDeviceMemory::Reset() {
  if (driver_ == nullptr || !mapped_) return;
  Pieces p{handle_, address_, size_, /*reserved=*/true, /*mapped=*/true};
  Release(*driver_, p);
  mapped_ = false;
  handle_ = 0;
  address_ = 0;
  size_ = 0;
}

}  // namespace gradd::cuda
