// Moving every gradient from its place in the current bucket plan to its
// place in a rebuilt one (client/src/plan/rebuild.h), on both sides of the
// host/device line: host buckets by memcpy through a staging copy, CUDA
// buckets through the rank's DeviceClient (device_client.h), which waits
// for the GPU and copies through a host snapshot (region_moves.h). Pure
// logic apart from the device; called between iterations only.
#ifndef GRADD_CLIENT_SRC_PLAN_PLAN_MOVE_H_
#define GRADD_CLIENT_SRC_PLAN_PLAN_MOVE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/src/device/device_client.h"
#include "client/src/plan/plan_views.h"

namespace gradd {

// Copies bytes[i] bytes of parameter i from from[i] to to[i] for every i;
// the ranges may overlap each other arbitrarily.
void MoveGradients(const std::vector<char*>& from, const std::vector<char*>& to,
                   const std::vector<size_t>& bytes);

// Where the gradients are before the rebuild: by parameter, its address
// and whether its bucket is a CUDA one; the CUDA buckets of the plan.
struct GradientPlaces {
  std::vector<char*> data;
  std::vector<bool> on_device;
  std::vector<int> device_buckets;
};
// Moves every gradient (bytes[i] bytes of parameter i) from `now` to its
// place in `next`: host ones with MoveGradients, CUDA ones through
// `device` (null when the job has none; its memory is [base(), base() +
// size())) as RegionMoves, with `now.device_buckets` as the done events
// to wait for. INTERNAL, prefixed with `who`, when `next` puts a gradient
// on the other side of the host/device line or outside the device memory
// (then nothing is moved); the device's errors otherwise.
[[nodiscard]] absl::Status MoveToPlan(const GradientPlaces& now,
                                      const PlanViews& next,
                                      const std::vector<size_t>& bytes,
                                      DeviceClient* device,
                                      const std::string& who);

}  // namespace gradd

#endif  // GRADD_CLIENT_SRC_PLAN_PLAN_MOVE_H_
