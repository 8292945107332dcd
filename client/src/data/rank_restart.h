// RankRestart: one rank's side of rank restart (common/control_block.h,
// "Rank restart"; the job's rank_restart_grace_ms > 0) over the job block's
// header: whether a finished iteration or collective round was aborted by a
// restarted rank (and the ABORTED status that says so, marked
// kIterationAbortedPayload), and when this rank owes the job a state sync.
//
//   attach ──► [synced] ──sync_seq bumped──► [sync pending]
//     │ restarted    ▲                            │ BeginStateSync: one
//     ▼              │ first MarkReady after      │ allreduce (MIN) of
//   [unsynced] ──────┴── a successful sync ◄──────┘ SyncOffer.values
//
// What the sync agrees on (every rank computes the same from the same
// allreduce):
//   root    MIN over the ranks of (global rank, or INT32_MAX for a rank that
//           restarted and has not been synced since): the lowest rank that
//           holds the job's state; INT32_MAX: nobody does (an error).
//   handled MAX over the ranks of the sync_seq each read before the
//           allreduce (carried as MIN of its negation in the same round).
//           Every rank then considers the same re-attaches handled: a rank
//           that read sync_seq just before a re-attach and one that read it
//           just after take part in the same round (the restarted rank's own
//           offer is in it, and its read includes its own bump), so a
//           per-rank value could make one of them sync again alone.
//
// Why a rank may have to wait for the daemon after seeing an abort: the
// daemon publishes the aborted iteration's done words (step 1) before it
// bumps sync_seq (step 3). A rank that sees "done and aborted" in between
// would find no sync pending, start its next iteration and leave the others
// waiting in the sync's allreduce. AbortSettled() is the wait's predicate:
// the bump is visible, or the abort was already known when this rank last
// synced (the rank synced before it reached the aborted iteration).
//
// Node loss and arrival ("Re-formation", control block v6) reuses all of
// this: a re-formation aborts like a re-attach (aborted_rank = -1) and sets
// sync_seq to a value agreed by every node (the largest any node had, plus
// one), so sync_seq only ever grows but may jump by more than one: a sync is
// pending when it is *above* what was handled (handled may be another
// node's larger value, taken in the last sync's MAX). A rank whose node the
// re-formation found one iteration behind (header.state_behind) offers no
// state, like a restarted rank, until it has synced in that epoch and handed
// over a gradient.
//
// Owns no memory: the header belongs to the client's control mapping.
// Threads: NoteMarkReady from any thread (MarkReady's); everything else from
// the client's one caller thread. Depends on common/ and the public headers.
#ifndef GRADD_CLIENT_SRC_DATA_RANK_RESTART_H_
#define GRADD_CLIENT_SRC_DATA_RANK_RESTART_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/control_block.h"

namespace gradd {

class RankRestart {
 public:
  // What one rank contributes to the sync's allreduce: two int64 reduced
  // with MIN, and what it read before.
  struct SyncOffer {
    int64_t values[2] = {0, 0};  // {root candidate, -sync_seq read}
    uint64_t aborted_iteration = 0;
    uint64_t aborted_round = 0;
    uint64_t epoch = 0;  // header.epoch read with sync_seq
  };
  static constexpr int kSyncValues = 2;

  // At attach: the mapped job header (outlives this object) and what the
  // AttachResponse said.
  void Attach(const ControlHeader* header, bool restarted, uint32_t grace_ms,
              uint64_t sync_seq);

  bool restarted() const { return restarted_; }
  uint32_t grace_ms() const { return grace_ms_; }
  uint64_t iterations_aborted() const { return iterations_aborted_; }
  uint64_t restarts() const;
  // The live world size and re-formations so far (header; 0 before
  // Attach).
  int live_world_size() const;
  uint64_t epoch() const;
  // This rank will offer no state in the next sync because its node was
  // found behind by the last re-formation (and it has not synced since).
  bool StateBehind() const;

  // A state sync is due before this rank's next iteration or collective.
  bool SyncPending() const;
  // This rank's part of the sync's allreduce (read now).
  SyncOffer Offer(int global_rank) const;
  // After the allreduce (MIN, int64, kSyncValues elements) gave `reduced`:
  // the root, the sync marked handled. FAILED_PRECONDITION naming `who`
  // when no rank holds the state.
  absl::StatusOr<int> Agreed(const SyncOffer& offer, const int64_t* reduced,
                             const std::string& who);
  // A gradient was handed over: a restarted rank that synced holds the
  // job's state from now on (any thread).
  void NoteMarkReady();

  // Iteration `i` / round `k`, all of whose done words the caller saw
  // (acquire): whether the daemon aborted it.
  bool IterationAborted(uint64_t i) const;
  bool RoundAborted(uint64_t k) const;
  // Predicates for the wait after seeing an abort (see the top).
  bool IterationAbortSettled(uint64_t i) const;
  bool RoundAbortSettled(uint64_t k) const;
  // The ABORTED status (IsIterationAborted) for iteration `i` / round `k`
  // (`what` names the round's collective); counts aborted iterations. The
  // message names the cause: a local rank's restart, or a re-formation of
  // the job's network (aborted_rank -1).
  absl::Status IterationAbortedError(uint64_t i, const std::string& job);
  absl::Status RoundAbortedError(uint64_t k, const std::string& what,
                                 const std::string& job) const;

 private:
  bool SyncBumped() const;
  // Why the last abort happened, for the ABORTED messages.
  std::string AbortCause() const;

  const ControlHeader* header_ = nullptr;
  bool restarted_ = false;
  uint32_t grace_ms_ = 0;
  // The sync_seq the job's last sync (or the attach) accounted for.
  uint64_t handled_ = 0;
  // Aborts published before the reads of the last successful sync (or of
  // the attach): the re-attaches behind them were handled by it.
  uint64_t known_aborted_iteration_ = 0;
  uint64_t known_aborted_round_ = 0;
  // Rejoined and not synced since (offers no state), and whether a sync
  // ran since restarting (the first MarkReady after it ends "unsynced").
  std::atomic<bool> unsynced_{false};
  std::atomic<bool> synced_once_{false};
  // state_behind handling: the epoch of the last successful sync (before
  // its first MarkReady), and the epoch whose state_behind is over (the
  // rank synced in it and handed over a gradient since). kNoEpoch: none.
  static constexpr uint64_t kNoEpoch = UINT64_MAX;
  std::atomic<uint64_t> synced_epoch_{kNoEpoch};
  std::atomic<uint64_t> caught_up_epoch_{kNoEpoch};
  uint64_t iterations_aborted_ = 0;
};

}  // namespace gradd

#endif  // GRADD_CLIENT_SRC_DATA_RANK_RESTART_H_
