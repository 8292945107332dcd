#include "client/src/data/area_collectives.h"

#include <algorithm>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/collective_reduce.h"
#include "common/status_macros.h"

namespace gradd {
namespace {

// OK when `area` has an area and may run a collective now; `what` names
// the call in errors.
absl::Status CollectiveUsable(const CollectiveAreaInterface& area,
                              absl::string_view what) {
  RETURN_IF_ERROR(area.Usable(what));
  if (area.area_bytes() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what,
                     " needs a collective area: attach with "
                     "ClientOptions::collective_bytes > 0 (",
                     area.Who(), ")"));
  }
  return absl::OkStatus();
}

// Validated dtype / op of Allreduce and ReduceScatter: the element size.
absl::StatusOr<size_t> ReductionElementSize(const CollectiveAreaInterface& area,
                                            absl::string_view what,
                                            int32_t dtype, ReduceOp op) {
  absl::StatusOr<CollectiveDType> t = CollectiveDTypeFromInt(dtype);
  absl::StatusOr<CollectiveOp> o =
      CollectiveOpFromInt(static_cast<int32_t>(op));
  absl::Status s = !t.ok()   ? t.status()
                   : !o.ok() ? o.status()
                             : CheckReduction(*t, *o);
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", s.message(), " (", area.Who(), ")"));
  }
  return CollectiveDTypeSize(*t);
}

}  // namespace

absl::Status AreaAllreduce(CollectiveAreaInterface& area, void* data,
                           size_t count, int32_t dtype, ReduceOp op) {
  ASSIGN_OR_RETURN(const size_t elem,
                   ReductionElementSize(area, "Allreduce", dtype, op));
  RETURN_IF_ERROR(CollectiveUsable(area, "Allreduce"));
  if (count > 0 && data == nullptr) {
    return absl::InvalidArgumentError("Allreduce of a null buffer");
  }
  const size_t area_bytes = area.area_bytes();
  const size_t per_round = area_bytes / elem;
  if (per_round == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("Allreduce: the collective area of ", area_bytes,
                     " bytes holds no element (", area.Who(), ")"));
  }
  char* const shared = area.area();
  char* p = static_cast<char*>(data);
  size_t off = 0;  // elements
  do {
    const size_t n = std::min(count - off, per_round);
    if (n > 0) std::memcpy(shared, p + off * elem, n * elem);
    RETURN_IF_ERROR(area.Round(CollectiveKind::kAllreduce, dtype,
                               static_cast<int32_t>(op), n * elem, 0));
    if (n > 0) std::memcpy(p + off * elem, shared, n * elem);
    off += n;
  } while (off < count);
  return absl::OkStatus();
}

absl::Status AreaAllgather(CollectiveAreaInterface& area, const void* input,
                           size_t bytes, void* output) {
  RETURN_IF_ERROR(CollectiveUsable(area, "Allgather"));
  if (bytes > 0 && (input == nullptr || output == nullptr)) {
    return absl::InvalidArgumentError("Allgather of a null buffer");
  }
  const size_t area_bytes = area.area_bytes();
  const size_t world = static_cast<size_t>(area.world_size());
  // Every rank's block of a round must fit the area together.
  const size_t per_round = area_bytes / world;
  if (per_round == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("Allgather: the collective area of ", area_bytes,
                     " bytes is smaller than the world size ", world, " (",
                     area.Who(), ")"));
  }
  char* const shared = area.area();
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  size_t off = 0;
  do {
    const size_t n = std::min(bytes - off, per_round);
    if (n > 0) std::memcpy(shared, in + off, n);
    RETURN_IF_ERROR(area.Round(CollectiveKind::kAllgather, 0, 0, n, 0));
    for (size_t j = 0; j < world && n > 0; ++j) {
      std::memcpy(out + j * bytes + off, shared + j * n, n);
    }
    off += n;
  } while (off < bytes);
  return absl::OkStatus();
}

absl::Status AreaReduceScatter(CollectiveAreaInterface& area, const void* input,
                               void* output, size_t count, int32_t dtype,
                               ReduceOp op) {
  ASSIGN_OR_RETURN(const size_t elem,
                   ReductionElementSize(area, "ReduceScatter", dtype, op));
  RETURN_IF_ERROR(CollectiveUsable(area, "ReduceScatter"));
  if (count > 0 && (input == nullptr || output == nullptr)) {
    return absl::InvalidArgumentError("ReduceScatter of a null buffer");
  }
  const size_t area_bytes = area.area_bytes();
  const size_t world = static_cast<size_t>(area.world_size());
  // A round reduces the same slice [off, off + n) of every rank block,
  // packed block after block in the area; this rank keeps its block's.
  const size_t per_round = area_bytes / (world * elem);
  if (per_round == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("ReduceScatter: the collective area of ", area_bytes,
                     " bytes holds no element per rank (world size ", world,
                     ", ", area.Who(), ")"));
  }
  char* const shared = area.area();
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  const size_t me = static_cast<size_t>(area.global_rank());
  size_t off = 0;  // elements within a block
  do {
    const size_t n = std::min(count - off, per_round);
    for (size_t j = 0; j < world && n > 0; ++j) {
      std::memcpy(shared + j * n * elem, in + (j * count + off) * elem,
                  n * elem);
    }
    RETURN_IF_ERROR(area.Round(CollectiveKind::kReduceScatter, dtype,
                               static_cast<int32_t>(op), world * n * elem, 0));
    if (n > 0) {
      std::memcpy(out + off * elem, shared + me * n * elem, n * elem);
    }
    off += n;
  } while (off < count);
  return absl::OkStatus();
}

absl::Status AreaBarrier(CollectiveAreaInterface& area) {
  RETURN_IF_ERROR(CollectiveUsable(area, "Barrier"));
  return area.Round(CollectiveKind::kBarrier, 0, 0, 0, 0);
}

absl::Status AreaBroadcast(CollectiveAreaInterface& area, void* data,
                           size_t bytes, int root) {
  const size_t area_bytes = area.area_bytes();
  if (area_bytes == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("Broadcast needs a broadcast area: attach with "
                     "ClientOptions::broadcast_bytes or collective_bytes > 0 (",
                     area.Who(), ")"));
  }
  const int world = area.world_size();
  if (root < 0 || root >= world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Broadcast root ", root, " is not a rank of the job (world size ",
        world, ", ", area.Who(), ")"));
  }
  if (bytes > 0 && data == nullptr) {
    return absl::InvalidArgumentError("Broadcast of a null buffer");
  }
  // Larger data goes in rounds of at most the area's size (every rank
  // computes the same split from the same size).
  char* const shared = area.area();
  const int me = area.global_rank();
  char* p = static_cast<char*>(data);
  size_t off = 0;
  do {
    const size_t n = std::min(bytes - off, area_bytes);
    if (root == me && n > 0) std::memcpy(shared, p + off, n);
    RETURN_IF_ERROR(area.Round(CollectiveKind::kBroadcast, 0, 0, n, root));
    if (root != me && n > 0) std::memcpy(p + off, shared, n);
    off += n;
  } while (off < bytes);
  return absl::OkStatus();
}

}  // namespace gradd
