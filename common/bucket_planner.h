// DDP's bucket assignment (torch.distributed._compute_bucket_assignment_by_size
// in c10d's reducer), computed by the daemon and agreed by all nodes.
//
// Rules (DDP's, unit-tested in tests/unit/common/bucket_planner_test.cc):
//   * parameters are taken in reverse registration order (gradients become
//     ready roughly back to front);
//   * one open bucket per (dtype, device kind) (DDP: per (dtype, device)); a
//   parameter goes into its dtype's open
//     bucket; when that bucket's size reaches the current cap it is closed;
//   * the first bucket closed (per dtype: DDP keeps one cap list per key, so
//     each dtype's first bucket) is capped at first_bucket_cap bytes, later
//     ones at bucket_cap bytes;
//   * a parameter larger than the cap therefore closes its bucket at once:
//     it is alone unless its dtype's open bucket already held smaller ones
//     (exactly DDP's behaviour), and nothing is ever added after it;
//   * buckets are ordered by the (reverse-order) index of their first
//     parameter, the order in which they become ready.
// Inside a bucket, parameters are laid out contiguously in bucket order,
// each one's offset aligned to its element size.
//
// Note: DDP's first, pre-rebuild assignment runs in registration order and
// then reverses the bucket list (so its 1 MiB bucket is the last to become
// ready); gradd plans directly in reverse order, which is what DDP's bucket
// rebuild after the first iteration produces when gradients arrive back to
// front, so the small first bucket is the first to go to the network.
#ifndef GRADD_COMMON_BUCKET_PLANNER_H_
#define GRADD_COMMON_BUCKET_PLANNER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/dtype.h"

namespace gradd {

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype;
  DeviceKind device = DeviceKind::kCpu;

  size_t numel() const;
  size_t bytes() const;
};

struct Bucket {
  DType dtype;
  // kCuda: `offset` is inside the rank's device memory, else its memfd.
  DeviceKind device = DeviceKind::kCpu;
  std::vector<int32_t> params;        // indices into the param list
  std::vector<size_t> param_offsets;  // byte offsets inside the bucket
  size_t size_bytes = 0;              // payload bytes (no trailing padding)
  size_t offset = 0;                  // byte offset inside a rank's memory
  // Holds only gradd's own parameters (names starting with
  // kInternalParamPrefix, e.g. the client's used map): such a bucket is
  // averaged plainly, never through a communication hook.
  bool internal = false;
};

// Parameters whose names start with this are the client library's own
// (never a model's): the planners put them in buckets of their own, after
// every model bucket, so the model's buckets are exactly torch's (sizes,
// hooks such as batched PowerSGD that treat a bucket as one matrix).
inline constexpr std::string_view kInternalParamPrefix = "[gradd] ";
inline bool IsInternalParam(std::string_view name) {
  return name.substr(0, kInternalParamPrefix.size()) == kInternalParamPrefix;
}

struct BucketPlan {
  std::vector<Bucket> buckets;
  // Bytes of a rank's bucket memory: buckets at kBucketAlignment-aligned
  // offsets, rounded up to the page size.
  size_t total_bytes = 0;
  // The same for the CUDA buckets, laid out from 0 in the rank's device
  // memory; 0 when the model has none.
  size_t device_bytes = 0;
};

inline constexpr size_t kBucketAlignment = 256;

struct PlannerOptions {
  size_t first_bucket_cap_bytes = 1 << 20;
  size_t bucket_cap_bytes = 25 << 20;
};

// INVALID_ARGUMENT on an empty list, a negative dimension, an empty or
// duplicate name, an unknown dtype or a size that overflows; the message
// names the parameter.
absl::StatusOr<BucketPlan> PlanBuckets(const std::vector<ParamInfo>& params,
                                       const PlannerOptions& options);

// DDP's bucket rebuild (Reducer::rebuild_buckets): the same assignment by
// size, fed the parameters in `order` (the order their gradients became
// ready in an iteration; a permutation of 0..params.size()-1). As in DDP's
// rebuild, buckets are not re-sorted: they come in the order they closed,
// then each dtype's still-open bucket (in dtype order; DDP uses hash order
// there, which only matters for models with several dtypes). The order of
// parameters inside a bucket is their order in `order`. Errors as
// PlanBuckets, plus INVALID_ARGUMENT when `order` is not a permutation
// (naming the first index missing, repeated or out of range).
absl::StatusOr<BucketPlan> PlanBucketsInOrder(
    const std::vector<ParamInfo>& params, const std::vector<int32_t>& order,
    const PlannerOptions& options);

// Sets Bucket::internal on the buckets of `plan` that hold only internal
// parameters (a plan received from another node carries no flags).
void MarkInternalBuckets(const std::vector<ParamInfo>& params,
                         BucketPlan* plan);

// Upper bound on BucketPlan::total_bytes (kCpu) or device_bytes (kCuda) for
// any plan over `params` (every bucket order and cap: at most one bucket
// per parameter, each padded to kBucketAlignment), so memory laid out once
// can take any later plan. At least one page for kCpu (a memfd cannot be
// empty); 0 for kCuda when no parameter is on CUDA.
size_t MaxPlanBytes(const std::vector<ParamInfo>& params,
                    DeviceKind device = DeviceKind::kCpu);

}  // namespace gradd

#endif  // GRADD_COMMON_BUCKET_PLANNER_H_
