// The Job's side of join (uneven inputs): reads the ranks' JoinSlots, runs
// the JoinState (join_state.h, where the state machine is drawn), starts
// the rounds and the join iterations' buckets, publishes the JoinBoard.
// Engine thread only, except the round completion (any thread), which only
// fills the round mailbox and rings the engine's doorbell.
#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/doorbell.h"
#include "server/engine/job/job.h"

namespace gradd {

bool Job::JoinInPlay() {
  if (join_.active()) return true;
  void* base = control_.data();
  const uint64_t done_join = join_.done_join_seq();
  for (int r = 0; r < spec_.local_world_size; ++r) {
    if (layout_.join_slot(base, r)->join_seq.load(std::memory_order_acquire) >
        done_join) {
      return true;
    }
  }
  return false;
}

bool Job::Lagging(int rank, const std::atomic<uint64_t>& row, uint64_t* s) {
  if (layout_.join_slot(control_.data(), rank)
          ->joined_at.load(std::memory_order_acquire) != 0) {
    return true;
  }
  // joined_at is cleared (release) only after the rank moved its rows up:
  // having read 0, a re-read sees the moved row.
  *s = row.load(std::memory_order_acquire);
  return false;
}

std::vector<JoinRankView> Job::ReadJoinViews(uint64_t next_iteration) {
  void* base = control_.data();
  std::vector<JoinRankView> views(spec_.local_world_size);
  for (int r = 0; r < spec_.local_world_size; ++r) {
    const JoinSlot* slot = layout_.join_slot(base, r);
    JoinRankView& v = views[r];
    v.live = ranks_.live(r);
    // join: it is published last (release), after begin and flags.
    v.join_seq = slot->join_seq.load(std::memory_order_acquire);
    v.begin = slot->begin.load(std::memory_order_relaxed);
    v.flags = slot->flags.load(std::memory_order_relaxed);
    v.active_seq = slot->active_seq.load(std::memory_order_acquire);
    v.joined_at = slot->joined_at.load(std::memory_order_acquire);
    v.sync_bytes = slot->sync_bytes.load(std::memory_order_relaxed);
    for (size_t b = 0; b < plan_.buckets.size() && !v.published; ++b) {
      v.published = layout_.ready_row(base, r)[b].load(
                        std::memory_order_acquire) == next_iteration;
    }
  }
  return views;
}

bool Job::StepJoin() {
  void* base = control_.data();
  std::atomic<uint64_t>* done = layout_.done_seq(base);
  const size_t num_buckets = plan_.buckets.size();
  bool progress = false;

  if (join_.phase() == JoinState::Phase::kRound) {
    std::optional<JoinRoundResult::Result> round = round_result_.Take();
    if (!round.has_value()) return false;
    const absl::Status& status = round->status;
    if (!status.ok()) {
      return FailOnEngine(
          status.code(),
          absl::StrCat("job '", spec_.job_id, "' join round of iteration ",
                       join_.iteration(), ": ", status.message()));
    }
    absl::StatusOr<JoinState::Outcome> outcome = join_.Resolve(round->values);
    if (!outcome.ok()) {
      return FailOnEngine(outcome.status().code(), outcome.status().message());
    }
    PublishJoinOutcome(*outcome);
    return true;
  }

  if (join_.phase() == JoinState::Phase::kRunning) {
    for (size_t b = 0; b < num_buckets; ++b) {
      if (done[b].load(std::memory_order_acquire) < join_.iteration()) {
        return false;
      }
    }
    join_.IterationDone();
    progress = true;
  }

  // kOff or kCollecting. An join only between iterations.
  for (size_t b = 0; b < num_buckets; ++b) {
    if (started_[b] > done[b].load(std::memory_order_acquire)) {
      return progress;
    }
  }
  const uint64_t next = done[0].load(std::memory_order_acquire) + 1;
  absl::StatusOr<std::vector<double>> round =
      join_.Poll(ReadJoinViews(next), next);
  if (!round.ok()) {
    return FailOnEngine(round.status().code(), round.status().message());
  }
  if (round->empty()) return progress;
  JoinRoundWork work;
  work.iteration = join_.iteration();
  work.values = *std::move(round);
  hand_overs_.Started();
  reducer_->StartJoinRound(
      std::move(work), [this](absl::Status s, std::vector<double> values) {
        round_result_.Post(std::move(s), std::move(values));
        ReducerWorkDone();
        doorbell_->Ring();
      });
  return true;
}

void Job::PublishJoinOutcome(const JoinState::Outcome& outcome) {
  JoinBoard* board = layout_.join_board(control_.data());
  if (outcome.kind == JoinState::Kind::kContinue) {
    board->max_active.store(outcome.max_active, std::memory_order_relaxed);
    board->decided_iteration.store(outcome.iteration,
                                   std::memory_order_release);
    WakeClients(layout_, control_.data());
    const bool none_here =
        std::none_of(outcome.local_active.begin(), outcome.local_active.end(),
                     [](bool a) { return a; });
    if (none_here && outcome.sync_bytes > 0) {
      // The active ranks elsewhere broadcast their sync from the highest
      // active rank; this node must take part in that collective too.
      if (outcome.sync_bytes > spec_.broadcast_bytes) {
        FailOnEngine(
            absl::StatusCode::kInvalidArgument,
            absl::StrCat("job '", spec_.job_id, "': the join sync of ",
                         outcome.sync_bytes,
                         " bytes exceeds this node's broadcast area of ",
                         spec_.broadcast_bytes, " bytes"));
        return;
      }
      phantom_scratch_.resize(outcome.sync_bytes);
      phantom_areas_ = {phantom_scratch_.data()};
      BroadcastWork work;
      work.seq = 0;
      work.root = outcome.max_active;
      work.bytes = outcome.sync_bytes;
      work.rank_areas = &phantom_areas_;
      const uint64_t iteration = outcome.iteration;
      hand_overs_.Started();
      reducer_->StartBroadcast(work, [this, iteration](absl::Status s) {
        if (!s.ok()) {
          PublishFailure(s.code(), absl::StrCat("job '", spec_.job_id,
                                                "' join sync of iteration ",
                                                iteration, ": ", s.message()));
        }
        ReducerWorkDone();
      });
    }
    return;
  }
  board->next_iteration.store(outcome.iteration, std::memory_order_relaxed);
  board->bcast_seq.store(
      header_->bcast_done_seq.load(std::memory_order_acquire),
      std::memory_order_relaxed);
  board->authoritative_rank.store(outcome.authoritative_rank,
                                  std::memory_order_relaxed);
  board->exhausted_rank.store(outcome.exhausted_rank,
                              std::memory_order_relaxed);
  board->done_join_seq.store(join_.done_join_seq(), std::memory_order_release);
  WakeClients(layout_, control_.data());
}

bool Job::ScanJoinBuckets() {
  if (join_.phase() != JoinState::Phase::kRunning) return false;
  void* base = control_.data();
  std::atomic<uint64_t>* done = layout_.done_seq(base);
  const JoinState::Outcome& current = join_.current();
  const uint64_t it = join_.iteration();
  const int world = spec_.local_world_size;
  bool progress = false;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const uint64_t d = done[b].load(std::memory_order_acquire);
    if (started_[b] > d || d + 1 != it) continue;
    bool ready = true;
    for (int r = 0; r < world && ready; ++r) {
      if (!current.local_active[r]) continue;
      const uint64_t s =
          layout_.ready_row(base, r)[b].load(std::memory_order_acquire);
      if (s == it) continue;
      ready = false;
      if (s != d) {
        return FailOnEngine(
            absl::StatusCode::kFailedPrecondition,
            absl::StrCat(RankName(r), " published bucket ", b,
                         " for iteration ", s, " while join iteration ", it,
                         " is in progress"));
      }
    }
    if (!ready) continue;
    // The job's hook is settled before its first bucket, join or not.
    if (!hook_resolved_ && !ResolveCommHook()) return false;
    std::vector<void*>& buffers = active_buffers_[b];
    std::vector<int>& ranks = active_ranks_[b];
    buffers.clear();
    ranks.clear();
    for (int r = 0; r < world; ++r) {
      if (!current.local_active[r]) continue;
      buffers.push_back(bucket_buffers_[b][r]);
      ranks.push_back(r);
    }
    started_[b] = it;
    progress = true;
    StartBucket(b, it, &buffers, current.divisor, &ranks);
  }
  return progress;
}

void Job::FailGoneInJoin() {
  for (int r = 0; r < spec_.local_world_size; ++r) {
    const RankStates::State state = ranks_.state(r);
    if (state == RankStates::kLive) continue;
    FailOnEngine(absl::StatusCode::kAborted,
                 absl::StrCat(RankName(r),
                              state == RankStates::kDetached ? " detached"
                                                             : " disconnected",
                              " during join (iteration ", join_.iteration(),
                              "); the job cannot continue"));
    return;
  }
}

}  // namespace gradd
