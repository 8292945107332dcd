// Where a parameter's gradient lives: host memory or a CUDA device. The
// plan keys buckets by (dtype, device kind) (DDP keys them by (dtype,
// device) inside one process; across ranks every trainer has its own GPU,
// so the plan, agreed by all ranks, keys by the kind and each rank names its
// GPU at attach). Mirrors gradd.v1.DeviceKind numerically.
#ifndef GRADD_COMMON_DEVICE_H_
#define GRADD_COMMON_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradd {

enum class DeviceKind : int32_t {
  kCpu = 0,
  kCuda = 1,
};

// "cpu", "cuda".
absl::string_view DeviceKindName(DeviceKind kind);
// Validates a raw wire value; INVALID_ARGUMENT names it.
absl::StatusOr<DeviceKind> DeviceKindFromInt(int value);

// One rank's GPU as the trainer sees it: its ordinal in the trainer's
// process (after CUDA_VISIBLE_DEVICES) and its UUID, which is what the
// daemon matches, since the daemon may see the same GPU under another
// ordinal.
struct CudaDevice {
  int ordinal = -1;
  std::string uuid;  // 16 raw bytes (cuDeviceGetUuid)
};

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" as nvidia-smi prints UUIDs;
// the raw bytes in hex when `uuid` is not 16 bytes long.
std::string FormatGpuUuid(absl::string_view uuid);

}  // namespace gradd

#endif  // GRADD_COMMON_DEVICE_H_
