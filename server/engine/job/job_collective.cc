// The Job's side of collective rounds: broadcasts (ScanBroadcast) and
// collectives of arbitrary data (allreduce, allgather, reduce_scatter,
// barrier; control_block.h, docs/protocol.md 5c): checks that every local
// rank describes the same round and hands it to the reducer (ScanBroadcast
// routes every round that is not a broadcast to StartAreaCollective). Engine
// thread only, except the round's completion (any thread), which publishes
// bcast_done_seq and wakes the ranks.
#include <string>

#include "absl/strings/str_cat.h"
#include "common/doorbell.h"
#include "server/engine/job/job.h"
#include "server/engine/reduce/area_collective.h"

namespace gradd {

bool Job::ScanBroadcast() {
  void* base = control_.data();
  const int world = spec_.local_world_size;
  const uint64_t d = header_->bcast_done_seq.load(std::memory_order_acquire);
  if (bcast_started_ > d) return false;  // still with the reducer
  const uint64_t need = d + 1;
  // Who takes part: every rank, or in a join iteration the active ones
  // (none of them broadcasts before the iteration is decided).
  // (No copy: this runs on every scan of the engine loop.)
  const std::vector<bool>* active = nullptr;
  if (join_.active()) {
    if (join_.phase() != JoinState::Phase::kRunning) return false;
    active = &join_.current().local_active;
  }
  auto part = [active](int r) { return active == nullptr || (*active)[r]; };
  int ready = 0;
  int parts = 0;
  int first_part = -1;
  for (int r = 0; r < world; ++r) {
    if (!part(r)) continue;
    ++parts;
    if (first_part < 0) first_part = r;
    const std::atomic<uint64_t>& row = layout_.bcast(base, r)->ready_seq;
    uint64_t s = row.load(std::memory_order_acquire);
    if (s < d && Lagging(r, row, &s)) continue;
    if (restarts_.BehindRoundAbort(
            s, d, header_->aborted_round.load(std::memory_order_acquire))) {
      continue;
    }
    if (s == need) {
      ++ready;
    } else if (s != d && ranks_.live(r)) {
      return FailOnEngine(absl::StatusCode::kFailedPrecondition,
                          absl::StrCat(RankName(r), " published broadcast ", s,
                                       " while broadcast ", need, " is next"));
    }
  }
  if (parts == 0 || ready < parts) return false;

  const BroadcastSlot* first = layout_.bcast(base, first_part);
  const int32_t root = first->root.load(std::memory_order_relaxed);
  const uint64_t bytes = first->bytes.load(std::memory_order_relaxed);
  const int32_t kind = first->kind.load(std::memory_order_relaxed);
  if (kind != static_cast<int32_t>(CollectiveKind::kBroadcast)) {
    return StartAreaCollective(need, first_part, parts < world);
  }
  for (int r = first_part + 1; r < world; ++r) {
    if (!part(r)) continue;
    const BroadcastSlot* slot = layout_.bcast(base, r);
    const int32_t rr = slot->root.load(std::memory_order_relaxed);
    const uint64_t rb = slot->bytes.load(std::memory_order_relaxed);
    const int32_t rk = slot->kind.load(std::memory_order_relaxed);
    if (rr != root || rb != bytes || rk != kind) {
      return FailOnEngine(
          absl::StatusCode::kInvalidArgument,
          absl::StrCat("job '", spec_.job_id, "': ranks disagree on broadcast ",
                       need, ": local rank ", first_part, " asks for root ",
                       root, ", ", bytes, " bytes; local rank ", r, " for ",
                       rk != kind ? CollectiveKindName(rk) + " with " : "",
                       "root ", rr, ", ", rb, " bytes"));
    }
  }
  const int global_world = spec_.global_world_size();
  if (root < 0 || root >= global_world) {
    return FailOnEngine(
        absl::StatusCode::kInvalidArgument,
        absl::StrCat("job '", spec_.job_id, "': broadcast ", need, " has root ",
                     root, ", outside ranks 0..", global_world - 1));
  }
  if (const int local_root = root - spec_.global_rank_offset;
      local_root >= 0 && local_root < world && !part(local_root)) {
    return FailOnEngine(absl::StatusCode::kInvalidArgument,
                        absl::StrCat("job '", spec_.job_id, "': broadcast ",
                                     need, " from root ", root,
                                     ", which has joined (ran out "
                                     "of inputs) in iteration ",
                                     join_.iteration()));
  }
  if (bytes > spec_.broadcast_bytes) {
    return FailOnEngine(
        absl::StatusCode::kInvalidArgument,
        absl::StrCat("job '", spec_.job_id, "': broadcast ", need, " of ",
                     bytes, " bytes exceeds the job's broadcast area of ",
                     spec_.broadcast_bytes, " bytes"));
  }
  bcast_started_ = need;
  BroadcastWork work;
  work.seq = need;
  work.root = root;
  work.bytes = bytes;
  work.rank_areas = &bcast_areas_;
  if (parts < world) {
    join_areas_.assign(world, nullptr);
    for (int r = 0; r < world; ++r) {
      if (part(r)) join_areas_[r] = bcast_areas_[r];
    }
    work.rank_areas = &join_areas_;
  }
  StartRound(work, "broadcast");
  return true;
}

bool Job::StartAreaCollective(uint64_t need, int first, bool join_mode) {
  // Round `need` is a collective other than broadcast: every local rank must
  // describe the same round; the daemon trusts none of the values.
  void* base = control_.data();
  const int world = spec_.local_world_size;
  auto fail = [this](absl::StatusCode code, const std::string& message) {
    return FailOnEngine(code, absl::StrCat("job '", spec_.job_id,
                                           "': collective round ", message));
  };
  struct Round {
    int32_t kind, dtype, op, root;
    uint64_t bytes;
    bool operator==(const Round& o) const {
      return kind == o.kind && dtype == o.dtype && op == o.op &&
             root == o.root && bytes == o.bytes;
    }
  };
  auto read = [&](int r) {
    const BroadcastSlot* slot = layout_.bcast(base, r);
    return Round{slot->kind.load(std::memory_order_relaxed),
                 slot->dtype.load(std::memory_order_relaxed),
                 slot->op.load(std::memory_order_relaxed),
                 slot->root.load(std::memory_order_relaxed),
                 slot->bytes.load(std::memory_order_relaxed)};
  };
  // Names where the values are valid, the raw numbers otherwise.
  auto describe = [](const Round& c) {
    const absl::StatusOr<CollectiveDType> dtype =
        CollectiveDTypeFromInt(c.dtype);
    const absl::StatusOr<CollectiveOp> op = CollectiveOpFromInt(c.op);
    return absl::StrCat(
        CollectiveKindName(c.kind), " (",
        dtype.ok() ? CollectiveDTypeName(*dtype)
                   : absl::StrCat("dtype ", c.dtype),
        ", ", op.ok() ? CollectiveOpName(*op) : absl::StrCat("op ", c.op),
        c.root != 0 ? absl::StrCat(", root ", c.root) : "", ", ", c.bytes,
        " bytes)");
  };
  const Round round = read(first);
  if (join_mode) {
    return fail(absl::StatusCode::kFailedPrecondition,
                absl::StrCat(need, ": ", CollectiveKindName(round.kind),
                             " in join mode (only broadcast runs there)"));
  }
  for (int r = first + 1; r < world; ++r) {
    const Round other = read(r);
    if (!(other == round)) {
      return fail(absl::StatusCode::kInvalidArgument,
                  absl::StrCat(need, ": local rank ", first, " (global rank ",
                               spec_.global_rank_offset + first, ") issued ",
                               describe(round), " but local rank ", r,
                               " (global rank ", spec_.global_rank_offset + r,
                               ") issued ", describe(other),
                               "; every rank must issue the same "
                               "collectives in the same order"));
    }
  }
  BroadcastWork work;
  work.seq = need;
  work.root = 0;
  work.bytes = round.bytes;
  work.rank_areas = &bcast_areas_;
  work.first_rank = spec_.global_rank_offset;
  // Global ranks never change (a lost node's are gone, not renumbered):
  // the areas are laid out over the initial world.
  work.world_size = spec_.global_world_size();
  switch (static_cast<CollectiveKind>(round.kind)) {
    case CollectiveKind::kAllreduce:
    case CollectiveKind::kReduceScatter: {
      absl::StatusOr<CollectiveDType> dtype =
          CollectiveDTypeFromInt(round.dtype);
      absl::StatusOr<CollectiveOp> op = CollectiveOpFromInt(round.op);
      absl::Status s = !dtype.ok() ? dtype.status()
                       : !op.ok()  ? op.status()
                                   : CheckReduction(*dtype, *op);
      if (!s.ok()) {
        return fail(
            absl::StatusCode::kInvalidArgument,
            absl::StrCat(need, " (", describe(round), "): ", s.message()));
      }
      if (round.bytes % CollectiveDTypeSize(*dtype) != 0) {
        return fail(absl::StatusCode::kInvalidArgument,
                    absl::StrCat(need, " (", describe(round),
                                 "): not a whole number of ",
                                 CollectiveDTypeName(*dtype), " elements"));
      }
      work.dtype = *dtype;
      work.op = *op;
      break;
    }
    case CollectiveKind::kAllgather:
      break;
    case CollectiveKind::kBarrier:
      if (round.bytes != 0) {
        return fail(
            absl::StatusCode::kInvalidArgument,
            absl::StrCat(need, ": barrier with ", round.bytes, " bytes"));
      }
      break;
    case CollectiveKind::kBroadcast:
    default:
      return fail(absl::StatusCode::kInvalidArgument,
                  absl::StrCat(need, ": unknown kind ", round.kind));
  }
  work.kind = static_cast<CollectiveKind>(round.kind);
  // Laid out (or divided) over the initial global ranks: wrong once a node
  // was lost or admitted (job_reformation.cc).
  if (reformation_.epoch().membership_changed() &&
      (work.kind == CollectiveKind::kAllgather ||
       work.kind == CollectiveKind::kReduceScatter ||
       (work.kind == CollectiveKind::kAllreduce &&
        work.op == CollectiveOp::kAvg))) {
    return fail(absl::StatusCode::kFailedPrecondition,
                absl::StrCat(need, " (", describe(round),
                             ") is not supported after a node was lost or "
                             "admitted (epoch ",
                             epoch(),
                             "); sum, min, max, broadcast and "
                             "barrier are"));
  }
  if (AreaBytesNeeded(work.kind, round.bytes, work.world_size) >
      spec_.broadcast_bytes) {
    return fail(
        absl::StatusCode::kInvalidArgument,
        absl::StrCat(need, " (", describe(round), ") needs ",
                     AreaBytesNeeded(work.kind, round.bytes, work.world_size),
                     " bytes of collective area; the job has ",
                     spec_.broadcast_bytes));
  }
  bcast_started_ = need;
  StartRound(work, "collective round");
  return true;
}

void Job::StartRound(const BroadcastWork& work, absl::string_view what) {
  const uint64_t need = work.seq;
  hand_overs_.Started();
  reducer_->StartBroadcast(work, [this, need, what](absl::Status s) {
    if (!s.ok()) {
      const std::string why = absl::StrCat("job '", spec_.job_id, "' ", what,
                                           " ", need, ": ", s.message());
      if (!NoteInterNodeError(s, why)) PublishFailure(s.code(), why);
    } else {
      header_->bcast_done_seq.store(need, std::memory_order_release);
      WakeClients(layout_, control_.data());
    }
    ReducerWorkDone();
  });
}

}  // namespace gradd
