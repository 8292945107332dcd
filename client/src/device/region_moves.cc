#include "client/src/device/region_moves.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradd {

absl::StatusOr<std::vector<RegionMove>> RegionMoves(
    const std::vector<char*>& from, const std::vector<char*>& to,
    const std::vector<size_t>& bytes, const char* base, uint64_t region_bytes) {
  if (from.size() != bytes.size() || to.size() != bytes.size()) {
    return absl::InternalError(
        absl::StrCat("gradient move: ", from.size(), " sources and ", to.size(),
                     " destinations for ", bytes.size(), " gradients"));
  }
  auto offset = [&](const char* p, size_t n, uint64_t* out) -> bool {
    if (p < base) return false;
    const uint64_t off = static_cast<uint64_t>(p - base);
    if (off > region_bytes || n > region_bytes - off) return false;
    *out = off;
    return true;
  };
  std::vector<RegionMove> moves;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] == 0) continue;
    RegionMove m;
    m.bytes = bytes[i];
    if (!offset(from[i], bytes[i], &m.from) ||
        !offset(to[i], bytes[i], &m.to)) {
      return absl::InternalError(absl::StrCat(
          "gradient move: gradient ", i, " (", bytes[i],
          " bytes) lies outside the ", region_bytes, "-byte region"));
    }
    moves.push_back(m);
  }
  std::sort(
      moves.begin(), moves.end(),
      [](const RegionMove& a, const RegionMove& b) { return a.from < b.from; });
  std::vector<RegionMove> merged;
  for (const RegionMove& m : moves) {
    if (!merged.empty()) {
      RegionMove& last = merged.back();
      if (last.from + last.bytes == m.from && last.to + last.bytes == m.to) {
        last.bytes += m.bytes;
        continue;
      }
    }
    merged.push_back(m);
  }
  return merged;
}

std::vector<SnapshotRun> SnapshotRuns(const std::vector<RegionMove>& moves) {
  std::vector<SnapshotRun> runs;
  uint64_t at = 0;
  for (const RegionMove& m : moves) {
    if (!runs.empty()) {
      SnapshotRun& last = runs.back();
      const uint64_t end = last.offset + last.bytes;
      if (m.from <= end) {  // touching or overlapping sources
        const uint64_t grow = std::max(end, m.from + m.bytes) - end;
        last.bytes += grow;
        at += grow;
        continue;
      }
    }
    runs.push_back(SnapshotRun{m.from, m.bytes, at});
    at += m.bytes;
  }
  return runs;
}

absl::Status MoveThroughSnapshot(
    const std::vector<RegionMove>& moves,
    absl::FunctionRef<absl::Status(uint64_t, uint64_t, void*)> copy_out,
    absl::FunctionRef<absl::Status(const void*, uint64_t, uint64_t)> copy_in,
    absl::FunctionRef<absl::Status()> sync) {
  const std::vector<SnapshotRun> runs = SnapshotRuns(moves);
  if (runs.empty()) return absl::OkStatus();
  std::vector<char> snapshot(runs.back().at + runs.back().bytes);
  // Whatever was queued reads or writes `snapshot`: finished before it goes.
  auto finish = [&sync](absl::Status s) {
    absl::Status synced = sync();
    return s.ok() ? synced : s;
  };
  for (const SnapshotRun& r : runs) {
    if (absl::Status s = copy_out(r.offset, r.bytes, snapshot.data() + r.at);
        !s.ok()) {
      return finish(std::move(s));
    }
  }
  if (absl::Status s = sync(); !s.ok()) return s;
  // Each move's source lies inside one run (runs are unions of sources,
  // in the moves' order).
  size_t run = 0;
  for (const RegionMove& m : moves) {
    while (runs[run].offset + runs[run].bytes < m.from + m.bytes) ++run;
    const char* src =
        snapshot.data() + runs[run].at + (m.from - runs[run].offset);
    if (absl::Status s = copy_in(src, m.to, m.bytes); !s.ok()) {
      return finish(std::move(s));
    }
  }
  return finish(absl::OkStatus());
}

}  // namespace gradd
