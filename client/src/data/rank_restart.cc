#include "client/src/data/rank_restart.h"

#include <algorithm>
#include <climits>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "gradd/client.h"

namespace gradd {
namespace {

absl::Status Aborted(std::string message) {
  absl::Status s = absl::AbortedError(std::move(message));
  s.SetPayload(kIterationAbortedPayload, absl::Cord("1"));
  return s;
}

}  // namespace

void RankRestart::Attach(const ControlHeader* header, bool restarted,
                         uint32_t grace_ms, uint64_t sync_seq) {
  header_ = header;
  restarted_ = restarted;
  grace_ms_ = grace_ms;
  handled_ = sync_seq;
  // Nothing is known to be accounted for: an abort this rank meets before
  // its first sync waits for the re-attach's bump.
  known_aborted_iteration_ = 0;
  known_aborted_round_ = 0;
  unsynced_.store(restarted, std::memory_order_relaxed);
  synced_once_.store(false, std::memory_order_relaxed);
  synced_epoch_.store(kNoEpoch, std::memory_order_relaxed);
  caught_up_epoch_.store(kNoEpoch, std::memory_order_relaxed);
}

int RankRestart::live_world_size() const {
  return header_ == nullptr ? 0
                            : static_cast<int>(header_->world_size.load(
                                  std::memory_order_acquire));
}

uint64_t RankRestart::epoch() const {
  return header_ == nullptr ? 0
                            : header_->epoch.load(std::memory_order_acquire);
}

bool RankRestart::StateBehind() const {
  if (header_ == nullptr) return false;
  // sync_seq first: the daemon stores epoch and state_behind before it.
  header_->sync_seq.load(std::memory_order_acquire);
  const uint64_t e = header_->epoch.load(std::memory_order_acquire);
  return header_->state_behind.load(std::memory_order_acquire) != 0 &&
         caught_up_epoch_.load(std::memory_order_acquire) != e;
}

uint64_t RankRestart::restarts() const {
  return header_ == nullptr ? 0
                            : header_->restarts.load(std::memory_order_acquire);
}

bool RankRestart::SyncBumped() const {
  // Above, not different: handled_ is the largest value any rank read in
  // the last sync, which after a re-formation is the agreed value on every
  // node; a node's own sync_seq never goes back below it.
  return header_->sync_seq.load(std::memory_order_acquire) > handled_;
}

bool RankRestart::SyncPending() const {
  if (header_ == nullptr) return false;
  return unsynced_.load(std::memory_order_acquire) || SyncBumped();
}

RankRestart::SyncOffer RankRestart::Offer(int global_rank) const {
  SyncOffer offer;
  // sync_seq first (acquire): the aborts read after it include every one
  // whose re-attach it counts.
  const uint64_t seq = header_->sync_seq.load(std::memory_order_acquire);
  offer.aborted_iteration =
      header_->aborted_iteration.load(std::memory_order_acquire);
  offer.aborted_round = header_->aborted_round.load(std::memory_order_acquire);
  offer.epoch = header_->epoch.load(std::memory_order_acquire);
  const bool behind =
      header_->state_behind.load(std::memory_order_acquire) != 0 &&
      caught_up_epoch_.load(std::memory_order_acquire) != offer.epoch;
  offer.values[0] = unsynced_.load(std::memory_order_acquire) || behind
                        ? INT32_MAX
                        : global_rank;
  offer.values[1] = -static_cast<int64_t>(seq);
  return offer;
}

absl::StatusOr<int> RankRestart::Agreed(const SyncOffer& offer,
                                        const int64_t* reduced,
                                        const std::string& who) {
  if (reduced[0] >= INT32_MAX || reduced[0] < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state sync of ", who,
        ": no rank holds the job's state (every rank restarted since the "
        "last sync); restart the job from a checkpoint"));
  }
  handled_ = std::max(handled_, static_cast<uint64_t>(-reduced[1]));
  // The aborts this rank saw before the round were published by
  // re-attaches whose ranks took part in it (a round completes only with
  // every rank): the sync handled them.
  known_aborted_iteration_ =
      std::max(known_aborted_iteration_, offer.aborted_iteration);
  known_aborted_round_ = std::max(known_aborted_round_, offer.aborted_round);
  synced_epoch_.store(offer.epoch, std::memory_order_release);
  synced_once_.store(true, std::memory_order_release);
  return static_cast<int>(reduced[0]);
}

void RankRestart::NoteMarkReady() {
  if (!synced_once_.load(std::memory_order_acquire)) return;
  if (unsynced_.load(std::memory_order_relaxed)) {
    unsynced_.store(false, std::memory_order_release);
  }
  // A gradient after a sync in epoch e: this rank holds the job's state
  // again, whatever state_behind says for e.
  const uint64_t e = synced_epoch_.load(std::memory_order_acquire);
  if (e != kNoEpoch && caught_up_epoch_.load(std::memory_order_relaxed) != e) {
    caught_up_epoch_.store(e, std::memory_order_release);
  }
}

std::string RankRestart::AbortCause() const {
  const int32_t rank = header_->aborted_rank.load(std::memory_order_relaxed);
  if (rank < 0) {
    return absl::StrCat(
        "the job's network re-formed (a node was lost, came back or "
        "re-formed for a restarted rank; epoch ",
        header_->epoch.load(std::memory_order_relaxed), ", ",
        header_->world_size.load(std::memory_order_relaxed),
        " ranks taking part now)");
  }
  return absl::StrCat("local rank ", rank, " restarted and re-attached");
}

bool RankRestart::IterationAborted(uint64_t i) const {
  return header_ != nullptr && i > 0 &&
         header_->aborted_iteration.load(std::memory_order_acquire) == i;
}

bool RankRestart::RoundAborted(uint64_t k) const {
  return header_ != nullptr && k > 0 &&
         header_->aborted_round.load(std::memory_order_acquire) == k;
}

bool RankRestart::IterationAbortSettled(uint64_t i) const {
  return known_aborted_iteration_ >= i || SyncBumped();
}

bool RankRestart::RoundAbortSettled(uint64_t k) const {
  return known_aborted_round_ >= k || SyncBumped();
}

absl::Status RankRestart::IterationAbortedError(uint64_t i,
                                                const std::string& job) {
  ++iterations_aborted_;
  return Aborted(absl::StrCat(
      "iteration ", i, " of job '", job, "' was aborted: ", AbortCause(),
      "; its gradients were not averaged: skip "
      "the optimizer step and retry the batch; the job goes on (run the "
      "state sync first: Client::StateSyncPending / BeginStateSync)"));
}

absl::Status RankRestart::RoundAbortedError(uint64_t k, const std::string& what,
                                            const std::string& job) const {
  return Aborted(absl::StrCat(
      what, " (collective round ", k, ") of job '", job,
      "' was aborted: ", AbortCause(),
      "; its result is not valid: skip the step "
      "that needed it and retry it; the job goes on (run the state sync "
      "first: Client::StateSyncPending / BeginStateSync)"));
}

}  // namespace gradd
