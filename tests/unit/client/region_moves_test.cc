#include "client/src/device/region_moves.h"

#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(RegionMovesTest, OffsetsSortedBySourceEmptyOnesDropped) {
  std::vector<char> region(100);
  char* b = region.data();
  absl::StatusOr<std::vector<RegionMove>> moves =
      RegionMoves({b + 40, b + 0, b + 90}, {b + 0, b + 60, b + 10}, {8, 4, 0},
                  b, region.size());
  ASSERT_TRUE(moves.ok()) << moves.status();
  EXPECT_THAT(*moves, ElementsAre(RegionMove{0, 60, 4}, RegionMove{40, 0, 8}));
}

TEST(RegionMovesTest, NeighboursThatStayNeighboursMergeIntoOneCopy) {
  std::vector<char> region(256);
  char* b = region.data();
  // 0..12 and 12..20 stay adjacent (to 100 and 112); 20..24 goes elsewhere;
  // 24..28 follows 20..24 before but not after.
  absl::StatusOr<std::vector<RegionMove>> moves = RegionMoves(
      {b + 12, b + 0, b + 20, b + 24}, {b + 112, b + 100, b + 0, b + 200},
      {8, 12, 4, 4}, b, region.size());
  ASSERT_TRUE(moves.ok()) << moves.status();
  EXPECT_THAT(*moves, ElementsAre(RegionMove{0, 100, 20}, RegionMove{20, 0, 4},
                                  RegionMove{24, 200, 4}));
}

TEST(RegionMovesTest, RangesOutsideTheRegionAreInternalErrors) {
  std::vector<char> region(64);
  char* b = region.data();
  absl::StatusOr<std::vector<RegionMove>> past =
      RegionMoves({b + 0, b + 8}, {b + 60, b + 0}, {4, 8}, b, 62);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(past.status().message(), HasSubstr("gradient 0 (4 bytes)"));
  std::vector<char> other(8);
  absl::StatusOr<std::vector<RegionMove>> before =
      RegionMoves({other.data()}, {b}, {4}, b, 64);
  EXPECT_EQ(before.status().code(), absl::StatusCode::kInternal);
  absl::StatusOr<std::vector<RegionMove>> sizes =
      RegionMoves({b}, {b, b}, {4}, b, 64);
  EXPECT_EQ(sizes.status().code(), absl::StatusCode::kInternal);
}

TEST(SnapshotRunsTest, AdjacentSourcesShareARunGapsStartNewOnes) {
  EXPECT_THAT(SnapshotRuns({}), ElementsAre());
  const std::vector<SnapshotRun> runs = SnapshotRuns(
      {{0, 500, 4}, {4, 0, 8}, {20, 100, 4}, {24, 300, 16}, {64, 8, 4}});
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].offset, 0u);
  EXPECT_EQ(runs[0].bytes, 12u);
  EXPECT_EQ(runs[0].at, 0u);
  EXPECT_EQ(runs[1].offset, 20u);
  EXPECT_EQ(runs[1].bytes, 20u);
  EXPECT_EQ(runs[1].at, 12u);
  EXPECT_EQ(runs[2].offset, 64u);
  EXPECT_EQ(runs[2].bytes, 4u);
  EXPECT_EQ(runs[2].at, 32u);
}

// A "device" region only reachable through copy callbacks, as the CUDA
// client's is; every gradient must arrive intact however the old and new
// places overlap.
class FakeRegion {
 public:
  explicit FakeRegion(size_t bytes) : bytes_(bytes) {}
  char* data() { return bytes_.data(); }
  absl::Status CopyOut(uint64_t off, uint64_t n, void* host) {
    ++copies_out;
    if (fail_out) return absl::UnavailableError("copy out failed");
    std::memcpy(host, bytes_.data() + off, n);
    return absl::OkStatus();
  }
  absl::Status CopyIn(const void* host, uint64_t off, uint64_t n) {
    ++copies_in;
    std::memcpy(bytes_.data() + off, host, n);
    return absl::OkStatus();
  }
  int copies_out = 0;
  int copies_in = 0;
  bool fail_out = false;

 private:
  std::vector<char> bytes_;
};

TEST(MoveThroughSnapshotTest, OverlappingPermutationKeepsEveryGradient) {
  // 40 gradients of assorted sizes packed from 0, moved to a shuffled
  // packing of the same region (a bucket rebuild in miniature).
  std::mt19937 rng(7);
  std::vector<size_t> bytes(40);
  for (size_t& n : bytes) n = 1 + rng() % 37;
  const size_t total = std::accumulate(bytes.begin(), bytes.end(), size_t{0});
  FakeRegion region(total + 64);
  char* base = region.data();
  std::vector<char*> from(bytes.size()), to(bytes.size());
  size_t at = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    from[i] = base + at;
    for (size_t k = 0; k < bytes[i]; ++k)
      from[i][k] = static_cast<char>(i * 5 + k);
    at += bytes[i];
  }
  std::vector<size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  at = 16;  // shifted too, so nothing stays put
  for (size_t i : order) {
    to[i] = base + at;
    at += bytes[i];
  }
  absl::StatusOr<std::vector<RegionMove>> moves =
      RegionMoves(from, to, bytes, base, total + 64);
  ASSERT_TRUE(moves.ok()) << moves.status();
  absl::Status s = MoveThroughSnapshot(
      *moves,
      [&](uint64_t off, uint64_t n, void* h) {
        return region.CopyOut(off, n, h);
      },
      [&](const void* h, uint64_t off, uint64_t n) {
        return region.CopyIn(h, off, n);
      },
      [] { return absl::OkStatus(); });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(region.copies_out, 1);  // the sources are one run
  EXPECT_EQ(region.copies_in, static_cast<int>(moves->size()));
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (size_t k = 0; k < bytes[i]; ++k) {
      ASSERT_EQ(to[i][k], static_cast<char>(i * 5 + k))
          << "gradient " << i << " byte " << k;
    }
  }
}

TEST(MoveThroughSnapshotTest, ErrorsComeBackAndTheSyncStillRuns) {
  FakeRegion region(32);
  region.fail_out = true;
  int syncs = 0;
  absl::Status s = MoveThroughSnapshot(
      {{0, 16, 8}},
      [&](uint64_t off, uint64_t n, void* h) {
        return region.CopyOut(off, n, h);
      },
      [&](const void* h, uint64_t off, uint64_t n) {
        return region.CopyIn(h, off, n);
      },
      [&] {
        ++syncs;
        return absl::OkStatus();
      });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(region.copies_in, 0);
  // The snapshot is freed only after queued copies finished.
  EXPECT_GE(syncs, 1);
}

TEST(MoveThroughSnapshotTest, SyncsBeforeTheCopiesInAndBeforeReturning) {
  FakeRegion region(32);
  std::vector<std::string> calls;
  absl::Status s = MoveThroughSnapshot(
      {{0, 16, 8}},
      [&](uint64_t, uint64_t, void*) {
        calls.push_back("out");
        return absl::OkStatus();
      },
      [&](const void*, uint64_t, uint64_t) {
        calls.push_back("in");
        return absl::OkStatus();
      },
      [&] {
        calls.push_back("sync");
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_THAT(calls, ElementsAre("out", "sync", "in", "sync"));
}

TEST(MoveThroughSnapshotTest, NoMovesNoCopies) {
  int calls = 0;
  absl::Status s = MoveThroughSnapshot(
      {},
      [&](uint64_t, uint64_t, void*) {
        ++calls;
        return absl::OkStatus();
      },
      [&](const void*, uint64_t, uint64_t) {
        ++calls;
        return absl::OkStatus();
      },
      [&] {
        ++calls;
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace gradd
