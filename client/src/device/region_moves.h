// Moving gradients inside one memory region that the CPU cannot simply
// memcpy (a rank's CUDA bucket memory) when the buckets are re-planned
// (client/src/plan/rebuild.h): the old and new places overlap each other
// arbitrarily, so the moves go through a host snapshot of their sources:
//
//   region ──copy_out(every source, merged into runs)──► snapshot (host)
//   snapshot ──copy_in(each merged move)──► region (the new places)
//
// Every source is read before any destination is written, so the order of
// the moves does not matter. Consecutive gradients that stay consecutive
// are merged into one copy (a bucket whose parameters keep their relative
// order moves in one piece), which matters when each copy is a driver
// call. Pure logic; the copies are the caller's (device_client.h).
#ifndef GRADD_CLIENT_SRC_DEVICE_REGION_MOVES_H_
#define GRADD_CLIENT_SRC_DEVICE_REGION_MOVES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradd {

// `bytes` bytes from offset `from` to offset `to` of the region.
struct RegionMove {
  uint64_t from = 0;
  uint64_t to = 0;
  uint64_t bytes = 0;
  bool operator==(const RegionMove& o) const {
    return from == o.from && to == o.to && bytes == o.bytes;
  }
};

// The moves of `from[i]` -> `to[i]` (bytes[i] bytes each; addresses inside
// [base, base + region_bytes)) as offsets, sorted by source, empty ones
// dropped, merged where a gradient follows its predecessor both before and
// after the move. Moves that do not move (from == to) are kept: the caller
// copies the whole snapshot back either way. INTERNAL naming the index
// when a range lies outside the region or the vectors differ in size.
absl::StatusOr<std::vector<RegionMove>> RegionMoves(
    const std::vector<char*>& from, const std::vector<char*>& to,
    const std::vector<size_t>& bytes, const char* base, uint64_t region_bytes);

// A contiguous range of the region the snapshot holds.
struct SnapshotRun {
  uint64_t offset = 0;  // in the region
  uint64_t bytes = 0;
  uint64_t at = 0;  // in the snapshot
};
// The sources of `moves` (sorted by source, as RegionMoves returns them)
// merged into maximal contiguous runs, laid out back to back.
std::vector<SnapshotRun> SnapshotRuns(const std::vector<RegionMove>& moves);

// Applies `moves` (RegionMoves) through a host snapshot: copy_out(offset,
// bytes, host) reads [offset, offset + bytes) of the region into host;
// copy_in(host, offset, bytes) writes it. Both may be asynchronous: sync()
// runs after the copies out (the snapshot is complete when it returns) and
// after the copies in (they have landed: the snapshot is freed then),
// also when a copy failed. The first error is returned as is; after an
// error the region may hold some moves done and some not (the caller
// fails the job). Nothing happens without moves.
[[nodiscard]] absl::Status MoveThroughSnapshot(
    const std::vector<RegionMove>& moves,
    absl::FunctionRef<absl::Status(uint64_t, uint64_t, void*)> copy_out,
    absl::FunctionRef<absl::Status(const void*, uint64_t, uint64_t)> copy_in,
    absl::FunctionRef<absl::Status()> sync);

}  // namespace gradd

#endif  // GRADD_CLIENT_SRC_DEVICE_REGION_MOVES_H_
