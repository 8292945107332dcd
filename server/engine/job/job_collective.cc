// The Job's side of collectives of arbitrary data (allreduce, allgather,
// reduce_scatter, barrier; control_block.h, docs/protocol.md 5c): checks that
// every local rank describes the same round and hands it to the reducer like
// a broadcast (ScanBroadcast, job.cc, routes every round that is not a
// broadcast here). Engine thread only, except the round's completion (any
// thread), which publishes bcast_done_seq and wakes the ranks.
#include <string>

#include "absl/strings/str_cat.h"
#include "common/doorbell.h"
#include "server/engine/job/job.h"
#include "server/engine/reduce/area_collective.h"

namespace gradd {

bool Job::StartAreaCollective(uint64_t need, int first, bool join_mode) {
  // Round `need` is a collective other than broadcast: every local rank must
  // describe the same round; the daemon trusts none of the values.
  void* base = control_.data();
  const int world = spec_.local_world_size;
  auto fail = [this](absl::StatusCode code, const std::string& message) {
    FailJob(code, absl::StrCat("job '", spec_.job_id, "': collective round ",
                               message));
    failed_ = true;
    return false;
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
  // was lost or admitted (job_elastic.cc).
  if (membership_changed_ && (work.kind == CollectiveKind::kAllgather ||
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
  in_flight_.fetch_add(1);
  reducer_->StartBroadcast(work, [this, need](absl::Status s) {
    if (!s.ok()) {
      const std::string what =
          absl::StrCat("job '", spec_.job_id, "' collective round ", need, ": ",
                       s.message());
      if (!NoteNetworkError(s, what)) FailJob(s.code(), what);
    } else {
      header_->bcast_done_seq.store(need, std::memory_order_release);
      WakeClients(layout_, control_.data());
    }
    ReducerWorkDone();
  });
  return true;
}

}  // namespace gradd
