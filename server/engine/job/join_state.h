// JoinState: one job's join (uneven inputs, DDP's join()) state machine on
// one node, as the engine thread sees it. Pure logic: the Job reads the
// control block (common/control_block.h, JoinSlot / JoinBoard) into
// JoinRankView snapshots, feeds them here and carries out the decisions
// (start a round, publish the board, start buckets with the active ranks
// only); tests drive it by hand.
//
// Decision (why the daemon and not the trainers): a joined trainer runs no
// shadow collectives. It publishes "joined from iteration i" and blocks in
// Client::Join(); the daemon contributes zeros for it: its buckets are left
// out of the local reduce (and never written), the divisor is the initial
// world size or the number of ranks still active. Across nodes every daemon
// must still issue the same collectives, so before bucket 0 of every
// iteration of a join the daemons allreduce a small "round" vector
// (who is active / joined, options, the sync size) on the network thread,
// in plan order. Plain jobs (no join) run no round and pay nothing.
//
//                 any local rank opens join e (JoinSlot.join_seq = e)
//   kOff --------------------------------------------------------+
//    ^                                                            v
//    |                                     kCollecting(i = begin of e)
//    |                      every local rank active (active_seq >= i)
//    |                      or joined (joined_at <= i): Contribution()
//    |                                                            v
//    |                                                     kRound(i)
//    |        Resolve(summed round):                              |
//    +-- kComplete: no rank active (authoritative rank = highest  |
//    |   rank active in the last iteration that had any)          |
//    +-- kThrown: throw_on_early_termination, some rank joined    |
//    |   while others are still active                             |
//    |                                                            v
//    |                      kContinue: divisor, max active  kRunning(i)
//    |                      buckets of i run with the local active ranks
//    |                      (zeros when none); all done: IterationDone()
//    |                                                            v
//    +------------------------------------------------ kCollecting(i + 1)
//
// The round vector (float64, summed across nodes; exact for integers):
//   [0] iteration  [1] divide_by_initial_world_size  [2] throw flag
//   [3] 1 per node [4 + g] global rank g: -1 joined, sync_bytes + 1 active
// Each node fills only its own ranks, so after the sum every node knows
// every rank's state; [0..3] must equal num_nodes times one node's value,
// or the nodes disagree (entered join mode at different iterations or with
// different options) and the job fails with that message.
//
// Thread: the engine thread only. Errors: INVALID_ARGUMENT /
// FAILED_PRECONDITION naming the job and local rank (protocol misuse:
// ranks that enter join mode at different iterations or with different
// options, an active rank that also joined, a join that skips ahead).
#ifndef GRADD_SERVER_ENGINE_JOB_JOIN_STATE_H_
#define GRADD_SERVER_ENGINE_JOB_JOIN_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradd {

// One local rank's join state as read from its JoinSlot.
struct JoinRankView {
  bool live = true;
  uint64_t join_seq = 0;
  uint64_t begin = 0;
  uint64_t active_seq = 0;
  uint64_t joined_at = 0;
  uint64_t sync_bytes = 0;
  uint32_t flags = 0;
  // The rank published a bucket of iteration i (for misuse detection).
  bool published = false;
};

class JoinState {
 public:
  enum class Phase { kOff, kCollecting, kRound, kRunning };
  enum class Kind { kContinue, kComplete, kThrown };

  struct Outcome {
    Kind kind = Kind::kContinue;
    uint64_t iteration = 0;
    // kContinue: the iteration's divisor, its highest active global rank,
    // the bytes of its sync broadcast (0: none) and which local ranks take
    // part (by local rank).
    double divisor = 1;
    int max_active = -1;
    uint64_t sync_bytes = 0;
    std::vector<bool> local_active;
    int global_active = 0;
    // kComplete: whose model every rank copies (torch: the highest rank
    // among the last to join).
    int authoritative_rank = -1;
    // kThrown: the lowest global rank that ran out of inputs.
    int exhausted_rank = -1;
  };

  JoinState(std::string job_id, int local_world_size, int global_rank_offset,
            int world_size, int num_nodes);

  Phase phase() const { return phase_; }
  // The join being run (kOff: the last finished one) and the iteration
  // being decided or run.
  uint64_t join_seq() const { return join_seq_; }
  uint64_t done_join_seq() const { return done_join_seq_; }
  uint64_t iteration() const { return iteration_; }
  bool active() const { return phase_ != Phase::kOff; }

  // kOff: whether some rank opened a new join; kCollecting: whether every
  // rank is decided for iteration(). Returns the node's round contribution
  // when the round can start (then phase() is kRound), an empty vector to
  // wait, or an error. `next_iteration` is the engine's next iteration
  // (done_seq + 1 of every bucket).
  absl::StatusOr<std::vector<double>> Poll(
      const std::vector<JoinRankView>& ranks, uint64_t next_iteration);

  // kRound: the round's result (summed over nodes). kContinue moves to
  // kRunning; kComplete and kThrown end the join (kOff).
  absl::StatusOr<Outcome> Resolve(const std::vector<double>& summed);

  // kRunning: every bucket of iteration() is done; moves to kCollecting of
  // the next iteration.
  void IterationDone();

  // The outcome of the running iteration (kRunning).
  const Outcome& current() const { return current_; }

  // Length of the round vector.
  size_t round_size() const { return 4 + static_cast<size_t>(world_size_); }

 private:
  std::string RankName(int local_rank) const;

  const std::string job_id_;
  const int local_world_;
  const int offset_;
  const int world_size_;
  const int num_nodes_;

  Phase phase_ = Phase::kOff;
  uint64_t join_seq_ = 0;
  uint64_t done_join_seq_ = 0;
  uint64_t iteration_ = 0;
  uint32_t flags_ = 0;
  // Highest rank active in the last iteration that had an active rank; all
  // ranks are "last joiners" when none had (world_size - 1).
  int last_max_active_ = -1;
  Outcome current_;
  std::vector<bool> round_local_active_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_JOIN_STATE_H_
