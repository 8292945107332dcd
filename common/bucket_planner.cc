#include "common/bucket_planner.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradd {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

constexpr size_t kPageSize = 4096;

// Product of the dimensions, or an error naming the parameter on a negative
// dimension or an overflow (a malformed registration must not turn into a
// tiny bucket that the trainer then writes past).
absl::StatusOr<size_t> CheckedBytes(const ParamInfo& p, int index) {
  size_t elem = DTypeSize(p.dtype);
  if (elem == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", index, " (\"", p.name,
                     "\") has unsupported dtype ", static_cast<int>(p.dtype)));
  }
  size_t bytes = elem;
  for (int64_t d : p.shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", index, " (\"", p.name, "\") has negative dimension ", d,
          " in shape [", absl::StrJoin(p.shape, ", "), "]"));
    }
    if (d != 0 && bytes > std::numeric_limits<size_t>::max() / 2 /
                              static_cast<size_t>(d)) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", index, " (\"", p.name, "\") of shape [",
                       absl::StrJoin(p.shape, ", "), "] is too large"));
    }
    bytes *= static_cast<size_t>(d);
  }
  return bytes;
}

}  // namespace

size_t ParamInfo::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= d < 0 ? 0 : static_cast<size_t>(d);
  return n;
}

size_t ParamInfo::bytes() const { return numel() * DTypeSize(dtype); }

namespace {

// Names and sizes of `params`, checked; errors as PlanBuckets documents.
absl::StatusOr<std::vector<size_t>> CheckParams(
    const std::vector<ParamInfo>& params) {
  if (params.empty()) {
    return absl::InvalidArgumentError("no parameters to plan buckets for");
  }
  if (params.size() >
      static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("too many parameters: ", params.size()));
  }
  const int count = static_cast<int>(params.size());
  std::vector<size_t> bytes(params.size());
  absl::flat_hash_map<std::string_view, int> seen_names;
  for (int i = 0; i < count; ++i) {
    const ParamInfo& p = params[i];
    if (p.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", i, " has an empty name"));
    }
    // Names are how errors point at a parameter; two with one name would
    // make every later message ambiguous.
    auto [it, inserted] = seen_names.emplace(p.name, i);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameters ", it->second, " and ", i,
                       " have the same name \"", p.name, "\""));
    }
    auto b = CheckedBytes(p, i);
    if (!b.ok()) return b.status();
    bytes[i] = *b;
  }
  return bytes;
}

// DDP's _compute_bucket_assignment_by_size over the parameters in `order`.
// Each dtype has its own open bucket and its own position in the cap list
// [first_bucket_cap, bucket_cap]: the position advances when a bucket
// closes and then stays on the last cap. `sort_by_first`: order buckets by
// the position of their first parameter (DDP's initial assignment);
// otherwise closing order, then the open buckets in dtype order (DDP's
// rebuild).
BucketPlan Assign(const std::vector<ParamInfo>& params,
                  const std::vector<size_t>& bytes,
                  const std::vector<int32_t>& order,
                  const PlannerOptions& options, bool sort_by_first) {
  struct Open {
    std::vector<int32_t> params;
    size_t size = 0;
    int cap_index = 0;
    int first_position = 0;
  };
  const size_t caps[2] = {options.first_bucket_cap_bytes,
                          options.bucket_cap_bytes};
  // std::map: iteration in dtype order keeps the plan deterministic across
  // nodes when open buckets are flushed below (ties must not depend on
  // hashing).
  // Keyed by (device kind, dtype): DDP's per-(dtype, device) buckets.
  using Key = std::pair<DeviceKind, DType>;
  std::map<Key, Open> open;
  struct Closed {
    Key key;
    std::vector<int32_t> params;
    int first_position;  // position of params[0] in `order`
  };
  std::vector<Closed> closed;

  std::map<Key, std::vector<int32_t>> internal;
  for (int pos = 0; pos < static_cast<int>(order.size()); ++pos) {
    const int32_t i = order[pos];
    const Key dtype{params[i].device, params[i].dtype};
    if (IsInternalParam(params[i].name)) {
      internal[dtype].push_back(i);
      continue;
    }
    Open& bucket = open[dtype];
    if (bucket.params.empty()) bucket.first_position = pos;
    bucket.params.push_back(i);
    bucket.size += bytes[i];
    if (bucket.size >= caps[bucket.cap_index]) {
      closed.push_back(
          {dtype, std::move(bucket.params), bucket.first_position});
      bucket.params.clear();
      bucket.size = 0;
      if (bucket.cap_index == 0) bucket.cap_index = 1;
    }
  }
  for (auto& [dtype, bucket] : open) {
    if (bucket.params.empty()) continue;
    closed.push_back({dtype, std::move(bucket.params), bucket.first_position});
  }
  if (sort_by_first) {
    // The order in which buckets become ready: by their first parameter.
    std::sort(closed.begin(), closed.end(),
              [](const Closed& a, const Closed& b) {
                return a.first_position < b.first_position;
              });
  }

  // gradd's own parameters last, one bucket per dtype.
  const size_t model_buckets = closed.size();
  for (auto& [dtype, ids] : internal) {
    closed.push_back({dtype, std::move(ids), 0});
  }

  BucketPlan plan;
  plan.buckets.reserve(closed.size());
  // One layout per memory: the memfd (CPU buckets) and the device memory.
  std::map<DeviceKind, size_t> offsets;
  for (size_t k = 0; k < closed.size(); ++k) {
    Closed& c = closed[k];
    Bucket b;
    b.internal = k >= model_buckets;
    b.device = c.key.first;
    b.dtype = c.key.second;
    b.params = std::move(c.params);
    b.param_offsets.reserve(b.params.size());
    const size_t elem = DTypeSize(b.dtype);
    size_t at = 0;
    for (int32_t p : b.params) {
      // One dtype per bucket, so this is a no-op today; it keeps the
      // documented invariant should buckets ever mix element sizes.
      at = RoundUp(at, elem);
      b.param_offsets.push_back(at);
      at += bytes[p];
    }
    b.size_bytes = at;
    // Every bucket starts on its own cache lines (and a 256-byte boundary,
    // enough for any SIMD width) so kernels never straddle two buckets.
    size_t& offset = offsets[b.device];
    offset = RoundUp(offset, kBucketAlignment);
    b.offset = offset;
    offset += b.size_bytes;
    plan.buckets.push_back(std::move(b));
  }
  // At least one page: a memfd mapping cannot be empty, even when every
  // parameter has zero elements (or lives on a GPU).
  plan.total_bytes =
      std::max(RoundUp(offsets[DeviceKind::kCpu], kPageSize), kPageSize);
  plan.device_bytes = RoundUp(offsets[DeviceKind::kCuda], kPageSize);
  return plan;
}

}  // namespace

absl::StatusOr<BucketPlan> PlanBuckets(const std::vector<ParamInfo>& params,
                                       const PlannerOptions& options) {
  absl::StatusOr<std::vector<size_t>> bytes = CheckParams(params);
  if (!bytes.ok()) return bytes.status();
  // Reverse registration order: gradients become ready roughly back to
  // front.
  std::vector<int32_t> order(params.size());
  for (size_t k = 0; k < order.size(); ++k) {
    order[k] = static_cast<int32_t>(order.size() - 1 - k);
  }
  return Assign(params, *bytes, order, options, /*sort_by_first=*/true);
}

absl::StatusOr<BucketPlan> PlanBucketsInOrder(
    const std::vector<ParamInfo>& params, const std::vector<int32_t>& order,
    const PlannerOptions& options) {
  absl::StatusOr<std::vector<size_t>> bytes = CheckParams(params);
  if (!bytes.ok()) return bytes.status();
  if (order.size() != params.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ready order lists ", order.size(),
                     " parameters; the model has ", params.size()));
  }
  std::vector<int> seen_at(params.size(), -1);
  for (size_t pos = 0; pos < order.size(); ++pos) {
    const int32_t i = order[pos];
    if (i < 0 || static_cast<size_t>(i) >= params.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ready order names parameter index ", i, " at position ", pos,
          "; valid indices are 0..", params.size() - 1));
    }
    if (seen_at[i] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ready order names parameter ", i, " (\"", params[i].name,
          "\") twice, at positions ", seen_at[i], " and ", pos));
    }
    seen_at[i] = static_cast<int>(pos);
  }
  return Assign(params, *bytes, order, options, /*sort_by_first=*/false);
}

void MarkInternalBuckets(const std::vector<ParamInfo>& params,
                         BucketPlan* plan) {
  for (Bucket& b : plan->buckets) {
    b.internal = !b.params.empty();
    for (int32_t p : b.params) {
      if (p < 0 || static_cast<size_t>(p) >= params.size() ||
          !IsInternalParam(params[p].name)) {
        b.internal = false;
        break;
      }
    }
  }
}

size_t MaxPlanBytes(const std::vector<ParamInfo>& params, DeviceKind device) {
  size_t total = 0;
  bool any = false;
  for (const ParamInfo& p : params) {
    if (p.device != device) continue;
    any = true;
    total += RoundUp(p.bytes(), kBucketAlignment);
  }
  if (device != DeviceKind::kCpu) return any ? RoundUp(total, kPageSize) : 0;
  return std::max(RoundUp(total, kPageSize), kPageSize);
}

}  // namespace gradd
