// The engine's reading of a rank block (common/control_block.h): a rank
// writes arbitrary bytes into its own rank block, and the daemon reads them.
// Here a script of such writes (into real blocks laid out by ControlLayout)
// alternates with engine steps that read every rank's join slot the way the
// Job does (Job::ReadJoinViews, server/engine/job_join.cc) and feed the
// engine's join state machine (server/engine/job/join_state.h) through Poll,
// the node round (this node's contribution, summed over `num_nodes`
// nodes, the other nodes' entries taken from the input as a peer daemon
// would send them) and Resolve; and that read every rank's collective slot
// and run the checks the Job applies to it (collective kind, dtype, op,
// CheckReduction, AreaBytesNeeded).
// Properties: no crash, hang or sanitizer report (a rank may fail its own
// job, never the daemon); errors carry a canonical code and a message; an
// outcome is consistent (divisor > 0, active ranks within the world,
// iterations never go back).
//
// The Job's own reads are members of Job, which needs the whole engine; the
// reads here mirror them line for line (see the report of issue 20 for the
// extraction that would let this target call the Job's code itself).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/collective_reduce.h"
#include "common/control_block.h"
#include "server/engine/job/join_state.h"
#include "server/engine/reduce/area_collective.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using gradd::ControlLayout;
using gradd::JoinRankView;
using gradd::JoinState;
using gradd::fuzz::Input;

constexpr int kMaxSteps = 128;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

void CheckError(const absl::Status& s) {
  FUZZ_CHECK(!s.ok(), "an error that is OK");
  FUZZ_CHECK(
      static_cast<int>(s.code()) >= 1 && static_cast<int>(s.code()) <= 16,
      s.ToString());
  FUZZ_CHECK(!s.message().empty(), "an error without a message");
}

// As Job::ReadJoinViews: the join slot of every rank, and whether it
// published a bucket of `next_iteration`.
std::vector<JoinRankView> ReadJoinViews(const ControlLayout& layout, void* base,
                                        int world, uint32_t buckets,
                                        const std::vector<bool>& live,
                                        uint64_t next_iteration) {
  std::vector<JoinRankView> views(world);
  for (int r = 0; r < world; ++r) {
    const gradd::JoinSlot* slot = layout.join_slot(base, r);
    JoinRankView& v = views[r];
    v.live = live[r];
    v.join_seq = slot->join_seq.load(std::memory_order_acquire);
    v.begin = slot->begin.load(std::memory_order_relaxed);
    v.flags = slot->flags.load(std::memory_order_relaxed);
    v.active_seq = slot->active_seq.load(std::memory_order_acquire);
    v.joined_at = slot->joined_at.load(std::memory_order_acquire);
    v.sync_bytes = slot->sync_bytes.load(std::memory_order_relaxed);
    for (uint32_t b = 0; b < buckets && !v.published; ++b) {
      v.published = layout.ready_row(base, r)[b].load(
                        std::memory_order_acquire) == next_iteration;
    }
  }
  return views;
}

// The checks the Job applies to a rank's collective slot before it starts a
// round (Job::ScanBroadcast, Job::StartAreaCollective).
void CheckCollectiveSlot(const gradd::BroadcastSlot& slot, int world_size) {
  const int32_t kind = slot.kind.load(std::memory_order_relaxed);
  const uint64_t bytes = slot.bytes.load(std::memory_order_relaxed);
  FUZZ_CHECK(!gradd::CollectiveKindName(kind).empty(), "unnamed kind");
  auto dtype =
      gradd::CollectiveDTypeFromInt(slot.dtype.load(std::memory_order_relaxed));
  auto op = gradd::CollectiveOpFromInt(slot.op.load(std::memory_order_relaxed));
  if (!dtype.ok()) CheckError(dtype.status());
  if (!op.ok()) CheckError(op.status());
  if (dtype.ok() && op.ok()) {
    absl::Status s = gradd::CheckReduction(*dtype, *op);
    if (!s.ok()) CheckError(s);
    FUZZ_CHECK(gradd::CollectiveDTypeName(*dtype) != nullptr, "dtype name");
    FUZZ_CHECK(gradd::CollectiveOpName(*op) != nullptr, "op name");
  }
  if (kind >= 0 && kind <= 4) {
    const size_t needed = gradd::AreaBytesNeeded(
        static_cast<gradd::CollectiveKind>(kind), bytes, world_size);
    // Saturates rather than wraps: never less than the bytes asked for.
    FUZZ_CHECK(needed >= bytes || needed == SIZE_MAX, "AreaBytesNeeded wraps");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const int world = 1 + in.Take<uint8_t>() % 4;
  const int num_nodes = 1 + in.Take<uint8_t>() % 3;
  const int node_rank = in.Take<uint8_t>() % num_nodes;
  const uint32_t buckets = 1 + in.Take<uint8_t>() % 8;
  const int world_size = world * num_nodes;
  const int offset = node_rank * world;

  const ControlLayout layout(world, buckets);
  std::unique_ptr<void, FreeDeleter> memory(
      std::aligned_alloc(4096, layout.total_bytes()));
  std::memset(memory.get(), 0, layout.total_bytes());
  void* base = memory.get();
  layout.Initialize(base);

  JoinState join("fuzz", world, offset, world_size, num_nodes);
  std::vector<bool> live(world, true);
  uint64_t done = 0;  // the last iteration every bucket finished
  uint64_t last_outcome = 0;

  for (int step = 0; step < kMaxSteps && !in.empty(); ++step) {
    const uint8_t what = in.Take<uint8_t>() % 4;
    const int rank = in.Take<uint8_t>() % world;
    switch (what) {
      case 0: {
        // Rank `rank` writes bytes anywhere in its own block.
        const size_t at = in.Take<uint16_t>() % layout.rank_block_bytes();
        const std::string bytes = in.TakeString(256);
        const size_t n = std::min(bytes.size(), layout.rank_block_bytes() - at);
        std::memcpy(
            static_cast<char*>(base) + layout.rank_block_offset(rank) + at,
            bytes.data(), n);
        break;
      }
      case 1:
        // The rank's session closes.
        live[rank] = false;
        break;
      case 2: {
        // The engine steps the join state machine.
        if (join.phase() == JoinState::Phase::kRunning) {
          done = join.iteration();
          join.IterationDone();
        }
        absl::StatusOr<std::vector<double>> round = join.Poll(
            ReadJoinViews(layout, base, world, buckets, live, done + 1),
            done + 1);
        if (!round.ok()) {
          CheckError(round.status());
          return 0;  // the Job fails here
        }
        if (round->empty()) break;
        FUZZ_CHECK(round->size() == join.round_size(), "round size");
        FUZZ_CHECK(join.phase() == JoinState::Phase::kRound, "phase");
        // The other nodes: consistent headers unless the input says
        // otherwise, and their ranks' entries as their daemons report them.
        std::vector<double> summed = *round;
        const bool consistent = in.Take<uint8_t>() % 8 != 0;
        for (int k = 0; k < 4; ++k) {
          summed[k] = consistent ? (*round)[k] * num_nodes
                                 : static_cast<double>(in.Take<int16_t>());
        }
        for (int g = 0; g < world_size; ++g) {
          if (g >= offset && g < offset + world) continue;
          const int8_t v = in.Take<int8_t>();
          summed[4 + g] = v < 0 ? -1.0 : static_cast<double>(v);
        }
        absl::StatusOr<JoinState::Outcome> outcome = join.Resolve(summed);
        if (!outcome.ok()) {
          CheckError(outcome.status());
          return 0;
        }
        FUZZ_CHECK(outcome->iteration >= last_outcome, "iteration went back");
        last_outcome = outcome->iteration;
        if (outcome->kind == JoinState::Kind::kContinue) {
          FUZZ_CHECK(outcome->divisor > 0 && std::isfinite(outcome->divisor),
                     "divisor");
          FUZZ_CHECK(
              outcome->max_active >= 0 && outcome->max_active < world_size,
              "max_active");
          FUZZ_CHECK(outcome->local_active.size() == static_cast<size_t>(world),
                     "local_active");
        }
        break;
      }
      case 3:
        CheckCollectiveSlot(*layout.bcast(base, rank), world_size);
        break;
    }
  }
  return 0;
}
