#include "client/src/plan/plan_move.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/src/device/region_moves.h"

namespace gradd {

void MoveGradients(const std::vector<char*>& from, const std::vector<char*>& to,
                   const std::vector<size_t>& bytes) {
  size_t total = 0;
  for (size_t b : bytes) total += b;
  std::vector<char> staging(total);
  size_t at = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] > 0) std::memcpy(staging.data() + at, from[i], bytes[i]);
    at += bytes[i];
  }
  at = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] > 0) std::memcpy(to[i], staging.data() + at, bytes[i]);
    at += bytes[i];
  }
}

absl::Status MoveToPlan(const GradientPlaces& now, const PlanViews& next,
                        const std::vector<size_t>& bytes, DeviceClient* device,
                        const std::string& who) {
  const size_t n = bytes.size();
  if (now.data.size() != n || now.on_device.size() != n ||
      next.data.size() != n || next.bucket_of.size() != n) {
    return absl::InternalError(absl::StrCat(
        "bucket rebuild (", who, "): ", n, " gradients, but ", now.data.size(),
        " old and ", next.data.size(), " new places"));
  }
  std::vector<char*> host_from, host_to, device_from, device_to;
  std::vector<size_t> host_bytes, device_bytes;
  for (size_t i = 0; i < n; ++i) {
    const int b = next.bucket_of[i];
    const bool on_device = b >= 0 &&
                           static_cast<size_t>(b) < next.buckets.size() &&
                           next.buckets[b].device != 0;
    if (on_device != now.on_device[i]) {
      return absl::InternalError(absl::StrCat(
          "gradd sent an inconsistent rebuilt plan (", who, "): parameter ", i,
          " moves from ", now.on_device[i] ? "a CUDA" : "a host", " bucket to ",
          on_device ? "a CUDA" : "a host", " one"));
    }
    (on_device ? device_from : host_from).push_back(now.data[i]);
    (on_device ? device_to : host_to).push_back(next.data[i]);
    (on_device ? device_bytes : host_bytes).push_back(bytes[i]);
  }
  absl::StatusOr<std::vector<RegionMove>> moves = std::vector<RegionMove>();
  if (!device_from.empty()) {
    if (device == nullptr) {
      return absl::InternalError(absl::StrCat(
          "bucket rebuild (", who, "): CUDA buckets but no device memory"));
    }
    moves = RegionMoves(device_from, device_to, device_bytes, device->base(),
                        device->size());
    if (!moves.ok()) {
      return absl::InternalError(absl::StrCat("bucket rebuild (", who,
                                              "): ", moves.status().message()));
    }
  }
  MoveGradients(host_from, host_to, host_bytes);
  if (moves->empty()) return absl::OkStatus();
  return device->MoveGradients(*moves, now.device_buckets, who);
}

}  // namespace gradd
