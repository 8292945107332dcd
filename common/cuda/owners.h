// Move-only owners of driver objects (common/cuda/driver.h): a stream, an
// event (optionally interprocess), an event opened from another process's
// handle. Built by Create / Open, which return the driver's error with a
// caller-supplied context; destroyed on destruction. Thread-compatible.
// The caller makes the right context current first (UseDevice).
#ifndef GRADD_COMMON_CUDA_OWNERS_H_
#define GRADD_COMMON_CUDA_OWNERS_H_

#include <cuda.h>

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/cuda/driver.h"

namespace gradd::cuda {

// Retains `ordinal`'s primary context (the one the CUDA runtime, and so
// torch, uses) once per process, never releasing it, and makes it current
// on this thread.
[[nodiscard]] absl::Status UseDevice(const CudaDriver& driver, int ordinal,
                                     absl::string_view context);

class CudaStream {
 public:
  CudaStream() = default;
  // A non-blocking stream (does not synchronise with the legacy default
  // stream) on the current context.
  static absl::StatusOr<CudaStream> Create(const CudaDriver* driver,
                                           absl::string_view context);
  CudaStream(CudaStream&& o) noexcept
      : driver_(o.driver_), stream_(std::exchange(o.stream_, nullptr)) {}
  CudaStream& operator=(CudaStream&& o) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream();
  CUstream get() const { return stream_; }

 private:
  const CudaDriver* driver_ = nullptr;
  CUstream stream_ = nullptr;
};

class CudaEvent {
 public:
  CudaEvent() = default;
  // Timing disabled; `interprocess`: exportable with IpcHandle().
  static absl::StatusOr<CudaEvent> Create(const CudaDriver* driver,
                                          bool interprocess,
                                          absl::string_view context);
  // An event another process exported (64 handle bytes).
  static absl::StatusOr<CudaEvent> Open(const CudaDriver* driver,
                                        absl::string_view handle,
                                        absl::string_view context);
  CudaEvent(CudaEvent&& o) noexcept
      : driver_(o.driver_), event_(std::exchange(o.event_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& o) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent();
  CUevent get() const { return event_; }
  // The 64-byte CUipcEventHandle of an interprocess event.
  absl::StatusOr<std::string> IpcHandle(absl::string_view context) const;

 private:
  const CudaDriver* driver_ = nullptr;
  CUevent event_ = nullptr;
};

}  // namespace gradd::cuda

#endif  // GRADD_COMMON_CUDA_OWNERS_H_
