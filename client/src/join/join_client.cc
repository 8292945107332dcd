#include "client/src/join/join_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/doorbell.h"
#include "common/status_macros.h"

namespace gradd {

JoinClient::JoinClient(const ControlLayout& layout, void* control_base,
                       int local_rank, int bell_fd, int global_rank,
                       std::string who, Hooks hooks)
    : layout_(layout),
      base_(control_base),
      local_rank_(local_rank),
      bell_fd_(bell_fd),
      global_rank_(global_rank),
      who_(std::move(who)),
      hooks_(std::move(hooks)),
      slot_(layout_.join_slot(control_base, static_cast<uint32_t>(local_rank))),
      board_(layout_.join_board(control_base)) {
  // A client that attaches to a job whose earlier joins ended (it cannot,
  // today: jobs form once) would start counting from there.
  join_seq_ = slot_->join_seq.load(std::memory_order_acquire);
}

absl::Status JoinClient::Enter(const JoinOptions& options, uint64_t iteration) {
  if (in_join()) {
    return absl::FailedPreconditionError(
        absl::StrCat("join mode entered twice (", who_,
                     "); finish the running join with Join() first"));
  }
  flags_ =
      (options.divide_by_initial_world_size ? kJoinDivideByInitialWorldSize
                                            : 0) |
      (options.throw_on_early_termination ? kJoinThrowOnEarlyTermination : 0);
  slot_->flags.store(flags_, std::memory_order_relaxed);
  slot_->begin.store(iteration, std::memory_order_relaxed);
  slot_->sync_bytes.store(0, std::memory_order_relaxed);
  slot_->joined_at.store(0, std::memory_order_relaxed);
  synced_ = 0;
  open_.store(true, std::memory_order_release);
  // Release: the daemon reading the join sees begin and flags.
  slot_->join_seq.store(++join_seq_, std::memory_order_release);
  Ring();
  return absl::OkStatus();
}

absl::Status JoinClient::NoteActive(uint64_t iteration) {
  if (!in_join()) return absl::OkStatus();
  if (noted_.load(std::memory_order_relaxed) >= iteration) {
    return absl::OkStatus();
  }
  if (flags_ & kJoinThrowOnEarlyTermination) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gradient marked ready in iteration ", iteration,
        " before JoinActive (", who_,
        "); with throw_on_early_termination call JoinActive before "
        "computing each iteration"));
  }
  return Publish(iteration);
}

absl::Status JoinClient::Publish(uint64_t iteration) {
  if (noted_.exchange(iteration, std::memory_order_acq_rel) >= iteration) {
    return absl::OkStatus();
  }
  // A bucket published before this store only makes the daemon wait for
  // it: a rank counts as active once active_seq says so.
  slot_->active_seq.store(iteration, std::memory_order_release);
  Ring();
  return absl::OkStatus();
}

std::string JoinClient::ThrownMessage(int exhausted) const {
  return absl::StrCat(
      "Detected at least one rank that exhausted inputs (global rank ",
      exhausted,
      "). Throwing across all ranks (join with "
      "throw_on_early_termination=True; ",
      who_, ", global rank ", global_rank_, ")");
}

absl::Status JoinClient::Active(uint64_t iteration, void* sync_data,
                                size_t sync_bytes, CatchUp* catch_up) {
  if (!in_join()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "JoinActive outside join mode (", who_, "); call JoinEnter first"));
  }
  if (sync_bytes > 0 && synced_ >= iteration) {
    return absl::FailedPreconditionError(
        absl::StrCat("JoinActive with a sync called twice in iteration ",
                     iteration, " (", who_, ")"));
  }
  if (noted_.load(std::memory_order_acquire) < iteration) {
    slot_->sync_bytes.store(sync_bytes, std::memory_order_relaxed);
  } else if (sync_bytes > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "JoinActive with a sync after this rank already took part in "
        "iteration ",
        iteration, " (", who_, "); call it before marking gradients ready"));
  }
  RETURN_IF_ERROR(Publish(iteration));
  const bool throws = flags_ & kJoinThrowOnEarlyTermination;
  if (!throws && sync_bytes == 0) return absl::OkStatus();

  const uint64_t join = join_seq_;
  absl::Status s = hooks_.wait(
      [this, iteration, join] {
        return board_->decided_iteration.load(std::memory_order_acquire) >=
                   iteration ||
               board_->done_join_seq.load(std::memory_order_acquire) >= join;
      },
      absl::StrCat("the join decision of iteration ", iteration));
  if (!s.ok()) return s;
  if (board_->done_join_seq.load(std::memory_order_acquire) >= join) {
    const int exhausted =
        board_->exhausted_rank.load(std::memory_order_relaxed);
    *catch_up = Finish();
    if (exhausted >= 0) return absl::AbortedError(ThrownMessage(exhausted));
    return absl::InternalError(
        absl::StrCat("the join ended at iteration ", catch_up->next_iteration,
                     " while this rank was active in it (", who_, ")"));
  }
  if (sync_bytes == 0) return absl::OkStatus();
  synced_ = iteration;
  const int root = board_->max_active.load(std::memory_order_relaxed);
  return hooks_.broadcast(sync_data, sync_bytes, root);
}

absl::StatusOr<JoinResult> JoinClient::Join(uint64_t iteration,
                                            CatchUp* catch_up) {
  if (!in_join()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Join outside join mode (", who_, "); call JoinEnter first"));
  }
  if (noted_.load(std::memory_order_acquire) >= iteration) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Join in iteration ", iteration, " after this rank took part in it (",
        who_, "); finish the iteration (WaitAll) first"));
  }
  slot_->joined_at.store(iteration, std::memory_order_release);
  Ring();
  const uint64_t join = join_seq_;
  absl::Status s = hooks_.wait(
      [this, join] {
        return board_->done_join_seq.load(std::memory_order_acquire) >= join;
      },
      absl::StrCat("every rank to join (joined from iteration ", iteration,
                   ")"));
  if (!s.ok()) return s;
  const int exhausted = board_->exhausted_rank.load(std::memory_order_relaxed);
  JoinResult result;
  result.authoritative_rank =
      board_->authoritative_rank.load(std::memory_order_relaxed);
  *catch_up = Finish();
  result.next_iteration = catch_up->next_iteration;
  if (exhausted >= 0) {
    return absl::AbortedError(absl::StrCat("Rank ", global_rank_,
                                           " exhausted all inputs (join with "
                                           "throw_on_early_termination=True; ",
                                           who_, ")"));
  }
  return result;
}

JoinClient::CatchUp JoinClient::Finish() {
  CatchUp out;
  out.next_iteration = board_->next_iteration.load(std::memory_order_relaxed);
  out.bcast_seq = board_->bcast_seq.load(std::memory_order_relaxed);
  // Rows of a rank that joined early stand at the iteration it joined in;
  // the job moved on without it.
  std::atomic<uint64_t>* row =
      layout_.ready_row(base_, static_cast<uint32_t>(local_rank_));
  for (uint32_t b = 0; b < layout_.num_buckets(); ++b) {
    if (out.next_iteration > 0 &&
        row[b].load(std::memory_order_relaxed) < out.next_iteration - 1) {
      row[b].store(out.next_iteration - 1, std::memory_order_release);
    }
  }
  BroadcastSlot* bcast =
      layout_.bcast(base_, static_cast<uint32_t>(local_rank_));
  if (bcast->ready_seq.load(std::memory_order_relaxed) < out.bcast_seq) {
    bcast->ready_seq.store(out.bcast_seq, std::memory_order_release);
  }
  // Release: the daemon reading 0 here sees the rows above.
  slot_->joined_at.store(0, std::memory_order_release);
  open_.store(false, std::memory_order_release);
  Ring();
  return out;
}

void JoinClient::Ring() {
  RingDaemon(layout_.header(base_),
             layout_.rank_header(base_, static_cast<uint32_t>(local_rank_)),
             bell_fd_);
}

}  // namespace gradd
