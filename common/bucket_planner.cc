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

absl::StatusOr<BucketPlan> PlanBuckets(const std::vector<ParamInfo>& params,
                                       const PlannerOptions& options) {
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

  // DDP's _compute_bucket_assignment_by_size, fed the parameters in reverse
  // registration order. Each dtype has its own open bucket and its own
  // position in the cap list [first_bucket_cap, bucket_cap]: the position
  // advances when a bucket closes and then stays on the last cap.
  struct Open {
    std::vector<int32_t> params;
    size_t size = 0;
    int cap_index = 0;
  };
  const size_t caps[2] = {options.first_bucket_cap_bytes,
                          options.bucket_cap_bytes};
  // std::map: iteration in dtype order keeps the plan deterministic across
  // nodes when open buckets are flushed below (the final sort decides the
  // order anyway, but ties must not depend on hashing).
  std::map<DType, Open> open;
  struct Closed {
    DType dtype;
    std::vector<int32_t> params;
    int first_position;  // position of params[0] in the reversed order
  };
  std::vector<Closed> closed;
  auto position = [count](int32_t index) { return count - 1 - index; };

  for (int32_t i = count - 1; i >= 0; --i) {
    const DType dtype = params[i].dtype;
    Open& bucket = open[dtype];
    bucket.params.push_back(i);
    bucket.size += bytes[i];
    if (bucket.size >= caps[bucket.cap_index]) {
      int first = position(bucket.params.front());
      closed.push_back({dtype, std::move(bucket.params), first});
      bucket.params.clear();
      bucket.size = 0;
      if (bucket.cap_index == 0) bucket.cap_index = 1;
    }
  }
  for (auto& [dtype, bucket] : open) {
    if (bucket.params.empty()) continue;
    int first = position(bucket.params.front());
    closed.push_back({dtype, std::move(bucket.params), first});
  }
  // The order in which buckets become ready: by their first parameter.
  std::sort(closed.begin(), closed.end(), [](const Closed& a, const Closed& b) {
    return a.first_position < b.first_position;
  });

  BucketPlan plan;
  plan.buckets.reserve(closed.size());
  size_t offset = 0;
  for (Closed& c : closed) {
    Bucket b;
    b.dtype = c.dtype;
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
    offset = RoundUp(offset, kBucketAlignment);
    b.offset = offset;
    offset += b.size_bytes;
    plan.buckets.push_back(std::move(b));
  }
  // At least one page: a memfd mapping cannot be empty, even when every
  // parameter has zero elements.
  plan.total_bytes = std::max(RoundUp(offset, kPageSize), kPageSize);
  return plan;
}

}  // namespace gradd
