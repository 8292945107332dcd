// JoinClient: one rank's side of join (uneven inputs, DDP's join()) on the
// control block (common/control_block.h: JoinSlot / JoinBoard; the daemon's
// state machine is drawn in server/engine/job/join_state.h).
//
//   Enter(options)   before an iteration: join mode from it on (join e)
//   NoteActive(i)    this rank takes part in iteration i (MarkReady does it;
//                    with throw_on_early_termination Active must come first)
//   Active(i, sync)  the same, explicitly, before computing: with
//                    throw_on_early_termination it waits for the daemon's
//                    decision and fails if some rank ran out of inputs; with
//                    sync bytes it then copies them from the highest active
//                    rank (DDP's buffer broadcast in join mode)
//   Join(i)          out of inputs: the daemon contributes zeros for this
//                    rank from iteration i on; blocks until every rank
//                    joined, then catches this rank's rows up with the job
//
// Owns nothing but its counters; the control block mapping and the waits
// belong to the Client (passed in as hooks). Threads: NoteActive from any
// thread (MarkReady's), the rest from the Client's one caller thread.
#ifndef GRADD_CLIENT_SRC_JOIN_JOIN_CLIENT_H_
#define GRADD_CLIENT_SRC_JOIN_JOIN_CLIENT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/control_block.h"
#include "gradd/client.h"

namespace gradd {

class JoinClient {
 public:
  struct Hooks {
    // Blocks until ready() (bounded; fails on job errors / daemon gone).
    std::function<absl::Status(const std::function<bool()>& ready,
                               const std::string& what)>
        wait;
    // The Client's Broadcast (bypassing its join-mode guard).
    std::function<absl::Status(void* data, size_t bytes, int root)> broadcast;
  };
  // What the Client must take over after a join ended.
  struct CatchUp {
    uint64_t next_iteration = 0;
    uint64_t bcast_seq = 0;
  };

  // `bell_fd`: the write end of this rank's bell (not owned).
  JoinClient(const ControlLayout& layout, void* control_base, int local_rank,
             int bell_fd, int global_rank, std::string who, Hooks hooks);

  bool in_join() const { return open_.load(std::memory_order_acquire); }

  absl::Status Enter(const JoinOptions& options, uint64_t iteration);
  // FAILED_PRECONDITION with throw_on_early_termination when Active() was
  // not called first: the iteration may be abandoned, so nothing of it may
  // reach the daemon before the decision.
  absl::Status NoteActive(uint64_t iteration);
  // On a join that ended (thrown) while waiting, fills *catch_up.
  absl::Status Active(uint64_t iteration, void* sync_data, size_t sync_bytes,
                      CatchUp* catch_up);
  absl::StatusOr<JoinResult> Join(uint64_t iteration, CatchUp* catch_up);

 private:
  // After done_join_seq >= join_seq_: moves this rank's rows up to the job,
  // clears joined_at, leaves join mode.
  CatchUp Finish();
  // Declares this rank active in `iteration` (once; any thread).
  absl::Status Publish(uint64_t iteration);
  std::string ThrownMessage(int exhausted) const;
  void Ring();

  const ControlLayout layout_;
  void* const base_;
  const int local_rank_;
  const int bell_fd_;
  const int global_rank_;
  const std::string who_;
  const Hooks hooks_;
  JoinSlot* const slot_;
  JoinBoard* const board_;

  std::atomic<bool> open_{false};
  uint64_t join_seq_ = 0;
  uint32_t flags_ = 0;
  // The iteration last declared active in (any thread), and last synced.
  std::atomic<uint64_t> noted_{0};
  uint64_t synced_ = 0;
};

}  // namespace gradd

#endif  // GRADD_CLIENT_SRC_JOIN_JOIN_CLIENT_H_
