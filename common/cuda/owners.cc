#include "common/cuda/owners.h"

#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace gradd::cuda {

absl::Status UseDevice(const CudaDriver& d, int ordinal,
                       absl::string_view context) {
  CUdevice dev = 0;
  RETURN_IF_ERROR(CuCheck(d, d.cuDeviceGet(&dev, ordinal),
                          absl::StrCat(context, ": cuDeviceGet")));
  // Each device's primary context is retained once per process and never
  // released: releasing the last reference resets the context (frees every
  // allocation, stream and event in it), so a retain-then-release here
  // would destroy the context whenever no one else held it.
  static absl::Mutex mu(absl::kConstInit);
  static auto* retained =
      new std::map<std::pair<const CudaDriver*, CUdevice>, CUcontext>();
  CUcontext ctx = nullptr;
  {
    absl::MutexLock lock(&mu);
    auto it = retained->find({&d, dev});
    if (it != retained->end()) {
      ctx = it->second;
    } else {
      RETURN_IF_ERROR(
          CuCheck(d, d.cuDevicePrimaryCtxRetain(&ctx, dev),
                  absl::StrCat(context, ": cuDevicePrimaryCtxRetain")));
      retained->emplace(std::make_pair(&d, dev), ctx);
    }
  }
  return CuCheck(d, d.cuCtxSetCurrent(ctx),
                 absl::StrCat(context, ": cuCtxSetCurrent"));
}

absl::StatusOr<CudaStream> CudaStream::Create(const CudaDriver* driver,
                                              absl::string_view context) {
  CudaStream s;
  s.driver_ = driver;
  RETURN_IF_ERROR(CuCheck(
      *driver, driver->cuStreamCreate(&s.stream_, CU_STREAM_NON_BLOCKING),
      absl::StrCat(context, ": cuStreamCreate")));
  return s;
}

CudaStream& CudaStream::operator=(CudaStream&& o) noexcept {
  if (this != &o) {
    if (stream_ != nullptr) driver_->cuStreamDestroy(stream_);
    driver_ = o.driver_;
    stream_ = std::exchange(o.stream_, nullptr);
  }
  return *this;
}

CudaStream::~CudaStream() {
  if (stream_ != nullptr) driver_->cuStreamDestroy(stream_);
}

absl::StatusOr<CudaEvent> CudaEvent::Create(const CudaDriver* driver,
                                            bool interprocess,
                                            absl::string_view context) {
  CudaEvent e;
  e.driver_ = driver;
  unsigned flags = CU_EVENT_DISABLE_TIMING;
  if (interprocess) flags |= CU_EVENT_INTERPROCESS;
  RETURN_IF_ERROR(CuCheck(*driver, driver->cuEventCreate(&e.event_, flags),
                          absl::StrCat(context, ": cuEventCreate")));
  return e;
}

absl::StatusOr<CudaEvent> CudaEvent::Open(const CudaDriver* driver,
                                          absl::string_view handle,
                                          absl::string_view context) {
  CUipcEventHandle h;
  if (handle.size() != sizeof(h.reserved)) {
    return absl::InvalidArgumentError(
        absl::StrCat(context, ": an event handle of ", handle.size(),
                     " bytes (expected ", sizeof(h.reserved), ")"));
  }
  std::memcpy(h.reserved, handle.data(), sizeof(h.reserved));
  CudaEvent e;
  e.driver_ = driver;
  RETURN_IF_ERROR(CuCheck(*driver, driver->cuIpcOpenEventHandle(&e.event_, h),
                          absl::StrCat(context, ": cuIpcOpenEventHandle")));
  return e;
}

CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  if (this != &o) {
    if (event_ != nullptr) driver_->cuEventDestroy(event_);
    driver_ = o.driver_;
    event_ = std::exchange(o.event_, nullptr);
  }
  return *this;
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) driver_->cuEventDestroy(event_);
}

absl::StatusOr<std::string> CudaEvent::IpcHandle(
    absl::string_view context) const {
  CUipcEventHandle h;
  RETURN_IF_ERROR(CuCheck(*driver_, driver_->cuIpcGetEventHandle(&h, event_),
                          absl::StrCat(context, ": cuIpcGetEventHandle")));
  return std::string(h.reserved, sizeof(h.reserved));
}

}  // namespace gradd::cuda
