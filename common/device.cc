#include "common/device.h"

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace gradd {

absl::string_view DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

absl::StatusOr<DeviceKind> DeviceKindFromInt(int value) {
  switch (value) {
    case static_cast<int>(DeviceKind::kCpu):
      return DeviceKind::kCpu;
    case static_cast<int>(DeviceKind::kCuda):
      return DeviceKind::kCuda;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown device kind ", value, " (known: 0 = cpu, 1 = cuda)"));
}

std::string FormatGpuUuid(absl::string_view uuid) {
  const std::string hex = absl::BytesToHexString(uuid);
  if (uuid.size() != 16) return hex;
  return absl::StrCat("GPU-", hex.substr(0, 8), "-", hex.substr(8, 4), "-",
                      hex.substr(12, 4), "-", hex.substr(16, 4), "-",
                      hex.substr(20));
}

}  // namespace gradd
