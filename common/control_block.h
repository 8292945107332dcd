// The shared control state of one job on one node: the data-plane contract
// between the daemon and its local trainers.
//
// Version 3 splits it by writer, so that one rank cannot corrupt another
// rank or the job (issue 11):
//
//   job block   (one memfd, written only by the daemon):
//               [ControlHeader][done_seq: buckets x u64][JoinBoard]
//               The daemon maps it read-write, then seals it with
//               F_SEAL_FUTURE_WRITE: trainers can only map it PROT_READ
//               (mmap PROT_WRITE fails with EPERM, mprotect with EACCES).
//               Linux >= 5.1; an older kernel fails the job's creation.
//   rank block  (one memfd per local rank r, written by rank r; the daemon
//               writes its ready row only during a plan switch):
//               [RankHeader][ready_seq row][BroadcastSlot][JoinSlot]
//   bell        (one pipe per local rank): the daemon keeps the read end,
//               rank r gets the write end.
//
// Rank r receives the job block, its own rank block and the write end of its
// own bell (plus its bucket memory), nothing of the other ranks. Both sides
// map the blocks into one address range laid out as
//   [job block][rank block 0]...[rank block world-1]
// (ControlMapping, common/control_mapping.h), so ControlLayout computes every
// address from one base; a trainer leaves the other ranks' blocks PROT_NONE.
//
// Sequence numbers are iteration numbers starting at 1; 0 means "never".
//
// Gradient buckets, one iteration (client rank r, bucket b, iteration i):
//   client: writes its gradients into its bucket b, then
//           ready_seq(r)[b].store(i, release); RingDaemon
//   daemon: when ready_seq(r)[b] == i for every live rank r and
//           done_seq[b] == i - 1: reduces, writes results into every rank's
//           bucket b, done_seq[b].store(i, release); WakeClients
//   client: waits until done_seq[b] == i for every bucket (or header.status
//           != 0, then reads header.error).
//
// Wake-ups (common/doorbell.h). Client -> daemon: rank r bumps its own
// RankHeader::doorbell, and writes a byte to its bell only when
// header.daemon_sleeping says the daemon sleeps; the daemon spins on every
// rank's doorbell word, then poll()s on every bell. Daemon -> clients: rank r
// raises its own RankHeader::sleeping before futex-waiting on header.done_gen
// (FUTEX_WAIT needs only read access); the daemon bumps done_gen and calls
// futex wake if any rank's flag is up. Whatever a rank writes into its own
// words or bell can only delay its own wake-ups, never another rank's: the
// daemon keeps a separate "seen" value per rank and stops polling a bell
// whose write end was closed.
//
// Broadcast (op k = 1, 2, ...), independent of gradient iterations:
//   client: root copies bytes into its broadcast area; every rank sets
//           bcast(r).root / bcast(r).bytes, then bcast(r).ready_seq = k,
//           RingDaemon
//   daemon: when every rank is ready for k and all agree on root and bytes,
//           copies root's area into every other rank's area,
//           header.bcast_done_seq = k, WakeClients.
//
// Collectives (version 4): the broadcast slot and area carry every
// collective of arbitrary data (the area is the "collective area",
// AttachRequest.broadcast_bytes bytes per rank, after the bucket region in
// each rank's memory). A round k is one of CollectiveKind; besides root and
// bytes, rank r writes kind, dtype (gradd.v1.DType numbering, integers
// 5..8 included, common/collective_reduce.h) and op before ready_seq = k.
// The daemon starts round k when every rank is ready for it and all agree
// on (kind, dtype, op, bytes, root); a disagreement fails the job with
// INVALID_ARGUMENT naming both local ranks and both values. What the area
// holds, per kind (n = the job's global world size):
//   broadcast       bytes of the root's data -> every area
//   allreduce       bytes of elements -> the op over every rank's, in place
//   reduce_scatter  the same as allreduce for the daemon (the client packs
//                   the same slice of every rank block and reads its own)
//   allgather       bytes of this rank's block at offset 0 -> n * bytes, the
//                   blocks in global rank order (needs n * bytes <= area)
//   barrier         bytes 0; completes once every rank of the job is in it
// Across nodes the daemons first check that they run the same round (one
// small allreduce of the round's description), then reduce / gather through
// the job's collective backend.
//
// Join (uneven inputs, DDP's join(); the state machine is drawn in
// server/engine/job/join_state.h), per join e = 1, 2, ... (JoinSlot.join_seq):
//   client: JoinSlot(r): flags, begin = current iteration, then
//           join_seq.store(e, release) (entering join mode before iteration
//           `begin`); per iteration it takes part in: sync_bytes, then
//           active_seq.store(i, release); when out of inputs:
//           joined_at.store(i, release) (zeros from iteration i on).
//   daemon: per iteration, once every rank is active or joined: decides
//           (JoinBoard: max_active, then decided_iteration.store(i)), or
//           ends the join (next_iteration, bcast_seq, authoritative_rank,
//           exhausted_rank, then done_join_seq.store(e, release)).
//   client: after done_join_seq >= e, a rank that lags (joined early) moves its
//           ready rows to next_iteration - 1 and its broadcast row to
//           bcast_seq, then clears joined_at (release): until then the
//           daemon treats its old rows as "not ready", not as an error.
//
// Rank restart (version 5; the job's rank_restart_grace_ms > 0, single
// node). A rank whose session closes without Detach is "restarting": what
// needs it (a bucket it had not made ready, a collective round it had not
// entered) waits, up to the grace; past it the job fails naming the rank.
// What it had handed over before dying still completes (its memory stays
// mapped by the daemon). When it attaches again (Attach with the same job
// id, local rank and model; AttachResponse.rejoined), at a point where no
// bucket or round is with the reducer, the daemon:
//   1. aborts the gradient iteration in progress (some bucket done for
//      it), or else the next one (i = every done_seq + 1): aborted_rank,
//      then aborted_iteration.store(i, release), then every bucket not done
//      gets done_seq = i without being reduced. Aborting the next
//      iteration when none is in progress makes the rejoin one agreement
//      point for every rank: a survivor that checked for a state sync just
//      before it and went on into iteration i finds i aborted and syncs
//      before retrying, like a survivor that checks just after it;
//   2. aborts the collective round in progress, or else the next one,
//      likewise (aborted_round, then bcast_done_seq = k), so a survivor's
//      round and the rejoined rank's state sync never meet in one round;
//   3. writes the rank's ready row = the last iteration (done), its
//      collective row = bcast_done_seq, clears its JoinSlot, bumps
//      header.restarts, then header.sync_seq (release), WakeClients.
//   client: after WaitAll saw every done_seq == i, aborted_iteration == i
//           means iteration i was aborted: its buckets hold no average; the
//           client returns ABORTED (IterationAborted: skip the optimizer
//           step, retry the batch) and its next iteration is i + 1. A
//           collective round k completes with aborted_round == k likewise.
//           Before its next iteration's first bucket and first collective,
//           a rank that sees sync_seq differ from the value it last
//           handled takes part in the state sync: an allreduce (MIN) of
//           (its global rank, or INT32_MAX for a rank that rejoined and has
//           not been synced since), then a broadcast of the model state
//           from that root (gradd.torch: parameters, buffers and the
//           register_state()s); a restarted rank does it before its first
//           iteration. A root of INT32_MAX (no rank holds the state) is an
//           error. The C++ client (client/src/data/rank_restart.h) sends
//           that allreduce as 2 int64 with MIN: {root candidate,
//           -(sync_seq it read)}, so every rank also takes the same, largest
//           sync_seq as handled (the daemon does not look inside). A rank
//           that sees done == i and aborted_iteration == i but no sync_seq
//           bump yet (step 1 visible, step 3 not) waits for the bump before
//           it reports the abort, unless its last sync already saw it.
// The order matters: the aborted_* word is stored before the done / round
// words it explains, so a client that sees done == i reads the verdict.
//
// Re-formation (version 6; multi-node jobs with min_nodes or a rank restart
// grace: server/engine/formation/reformation.h). When the job's network
// breaks (a node died, or a node re-forms on purpose: a rank of it
// rejoined, a node arrives), every node's daemon drains its reducer, the
// nodes agree through the rendezvous store on the new membership, the
// highest iteration any of them completed and the new sync_seq, and open a
// fresh inter-node group. Then each daemon, once, exactly as steps 1-2 of
// "Rank restart" above: aborts the iteration in progress, or else the next
// one, and the collective round in progress, or else the next one
// (aborted_rank = -1: no local rank caused it); stores epoch, world_size,
// state_behind; then sync_seq = the agreed value (the same on every node:
// the largest any node had, plus one), WakeClients. Clients do what they
// do after a rank restart: report the abort, take part in the state sync
// (a rank whose node is state_behind offers INT32_MAX as root candidate,
// like a rank that rejoined), retry the batch. Global ranks never change:
// a lost node's ranks are gone, a returning node gets its old ones, a new
// node the ones after the highest; world_size is the live count.
// Ranks of a node admitted into a running job attach with rejoined = true.
//
// Failure: the daemon writes header.error (NUL-terminated), then
// header.status.store(absl::StatusCode, release), then WakeClients. Status
// never goes back to 0 for the life of the block.
//
// The daemon never trusts what ranks wrote: a ready_seq that skips ahead
// fails the job with a clear error. A rogue rank can fail its own job; it
// cannot reach another rank's rows, done_seq, status, error or another job.
#ifndef GRADD_COMMON_CONTROL_BLOCK_H_
#define GRADD_COMMON_CONTROL_BLOCK_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace gradd {

inline constexpr uint32_t kControlMagic = 0x47524444;  // "GRDD"
// 2: the daemon's heartbeat and the join region.
// 3: split into a read-only job block and per-rank blocks, per-rank bells.
// 4: collectives through the broadcast slot (kind, dtype, op).
// 5: rank restart (aborted iteration / round, state sync sequence).
// 6: node loss and arrival (epoch, live world size, state_behind).
inline constexpr uint32_t kControlVersion = 6;
inline constexpr size_t kControlErrorBytes = 1024;
inline constexpr size_t kCacheLine = 64;

struct alignas(kCacheLine) ControlHeader {
  uint32_t magic;
  uint32_t version;
  // Bucket slots: ready rows and done_seq have this many entries, one per
  // parameter, so that any plan (a bucket rebuild can change the number of
  // buckets) fits; the plan's buckets use the first ones.
  uint32_t num_buckets;
  uint32_t local_world_size;
  uint64_t total_bytes;

  // Non-zero while the daemon's engine sleeps in poll() on the bells:
  // clients write their bell only then.
  alignas(kCacheLine) std::atomic<uint32_t> daemon_sleeping;

  // Daemon -> clients: bumped after every done / error publish; clients
  // futex-wait on it (after raising their own RankHeader::sleeping).
  alignas(kCacheLine) std::atomic<uint32_t> done_gen;

  alignas(kCacheLine) std::atomic<uint64_t> bcast_done_seq;

  alignas(kCacheLine) std::atomic<int32_t> status;  // absl::StatusCode
  char error[kControlErrorBytes];

  // Daemon -> clients: MonotonicNs() of the daemon's last heartbeat,
  // stamped every few hundred ms while the job lives. A client waiting
  // for the daemon that sees it go stale (a stopped or wedged daemon keeps
  // its sockets open) fails with UNAVAILABLE instead of waiting for its
  // wait timeout.
  alignas(kCacheLine) std::atomic<uint64_t> heartbeat_ns;

  // Rank restart (version 5, see above). Daemon -> clients.
  // The last gradient iteration / collective round aborted (0: none).
  alignas(kCacheLine) std::atomic<uint64_t> aborted_iteration;
  std::atomic<uint64_t> aborted_round;
  // Bumped once per restarted rank re-attached: ranks run a state sync
  // when it changes.
  std::atomic<uint64_t> sync_seq;
  // Restarted ranks re-attached so far.
  std::atomic<uint64_t> restarts;
  // The local rank whose restart caused the last abort.
  std::atomic<int32_t> aborted_rank;
  // Local ranks away (session closed, within the grace) now.
  std::atomic<uint32_t> restarting;

  // Node loss and arrival (version 6, "Re-formation" above). Daemon ->
  // clients. Re-formations of the job's inter-node group so far.
  alignas(kCacheLine) std::atomic<uint64_t> epoch;
  // Global ranks taking part now (the job's world size until a node is
  // lost or added; a restarting rank still counts).
  std::atomic<uint32_t> world_size;
  // Non-zero after a re-formation that found this node one iteration
  // behind the others (its last iteration failed on the network while it
  // completed elsewhere): its ranks offer no state in the next state sync.
  std::atomic<uint32_t> state_behind;

  // Daemon -> clients, a scheduling hint (issue 36): 1 + the CPU of a local
  // rank the engine waits for (it has not published a bucket that other
  // ranks have), 0 for none. A rank spinning on that CPU stands down to
  // its futex sleep instead of holding the core the late rank needs; the
  // engine does the same. In the last line's padding, so the block's layout
  // and version are unchanged (an older daemon leaves it 0).
  std::atomic<uint32_t> stand_down_cpu;
};

// CLOCK_MONOTONIC in nanoseconds: one clock for every process on the host.
uint64_t MonotonicNs();

// Rank r's wake-up words, at the start of its rank block (written by rank r).
struct alignas(kCacheLine) RankHeader {
  // Bumped on every publish; the daemon spins on it before sleeping.
  std::atomic<uint32_t> doorbell;
  // Non-zero while rank r sleeps on done_gen: the daemon calls futex wake
  // only when some rank's flag is up.
  std::atomic<uint32_t> sleeping;
  // 1 + the CPU rank r last published from (0: not known), written by
  // RingDaemon. Only a hint for the engine's stand_down_cpu: a wrong value
  // can make waiters sleep instead of spin (a few microseconds), nothing
  // more.
  std::atomic<uint32_t> cpu;
};

// What a collective round does (BroadcastSlot::kind).
enum class CollectiveKind : int32_t {
  kBroadcast = 0,
  kAllreduce = 1,
  kAllgather = 2,
  kReduceScatter = 3,
  kBarrier = 4,
};
// "broadcast", "allreduce", ...; "kind <n>" for anything else.
std::string CollectiveKindName(int32_t kind);

// Rank -> daemon: rank r's next collective round (the broadcast slot of
// versions <= 3, which had only ready_seq, bytes and root).
struct alignas(kCacheLine) BroadcastSlot {
  std::atomic<uint64_t> ready_seq;
  std::atomic<uint64_t> bytes;
  std::atomic<int32_t> root;
  std::atomic<int32_t> kind;   // CollectiveKind
  std::atomic<int32_t> dtype;  // allreduce / reduce_scatter: element type
  std::atomic<int32_t> op;     // allreduce / reduce_scatter: reduction
};

// JoinSlot::flags.
inline constexpr uint32_t kJoinDivideByInitialWorldSize = 1;
inline constexpr uint32_t kJoinThrowOnEarlyTermination = 2;

// Rank -> daemon: rank r's join state (written only by rank r).
struct alignas(kCacheLine) JoinSlot {
  std::atomic<uint64_t> join_seq;    // joins entered; 0 = never
  std::atomic<uint64_t> begin;       // first iteration of join `join_seq`
  std::atomic<uint64_t> active_seq;  // last iteration declared active in
  std::atomic<uint64_t> joined_at;   // 0, or: joined from this iteration on
  std::atomic<uint64_t> sync_bytes;  // bytes of the per-iteration sync
  std::atomic<uint32_t> flags;       // kJoin* of join `join_seq`
};

// Daemon -> ranks: outcome of the join rounds (written only by the daemon).
struct alignas(kCacheLine) JoinBoard {
  // Last iteration the ranks may proceed with, and its highest active
  // global rank (the root of that iteration's sync).
  std::atomic<uint64_t> decided_iteration;
  std::atomic<int32_t> max_active;
  // The last finished join and how it ended: the job's next iteration,
  // the broadcast sequence at that moment, the rank whose model is final
  // (-1 when thrown) and the lowest rank that ran out of inputs when
  // thrown (-1 otherwise).
  alignas(kCacheLine) std::atomic<uint64_t> done_join_seq;
  std::atomic<uint64_t> next_iteration;
  std::atomic<uint64_t> bcast_seq;
  std::atomic<int32_t> authoritative_rank;
  std::atomic<int32_t> exhausted_rank;
};

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// Offsets of each region for a given job shape; both sides compute it.
// `base` is the start of the combined range (see the top of this file).
class ControlLayout {
 public:
  ControlLayout(uint32_t local_world_size, uint32_t num_buckets);

  // The combined range: job block + every rank block.
  size_t total_bytes() const { return total_bytes_; }
  size_t job_bytes() const { return job_bytes_; }
  size_t rank_block_bytes() const { return rank_block_bytes_; }
  size_t rank_block_offset(uint32_t rank) const {
    return job_bytes_ + rank_block_bytes_ * rank;
  }
  uint32_t local_world_size() const { return world_; }
  uint32_t num_buckets() const { return buckets_; }

  // Views into a mapped block (base must be the mapping's start).
  ControlHeader* header(void* base) const;
  RankHeader* rank_header(void* base, uint32_t rank) const;
  std::atomic<uint64_t>* ready_row(void* base, uint32_t rank) const;
  std::atomic<uint64_t>* done_seq(void* base) const;
  BroadcastSlot* bcast(void* base, uint32_t rank) const;
  JoinBoard* join_board(void* base) const;
  JoinSlot* join_slot(void* base, uint32_t rank) const;

  // Initialises a freshly mapped, zero-filled job block (daemon side).
  void Initialize(void* base) const;
  // Checks magic, version and shape of a job block mapped by a client.
  absl::Status Validate(const void* base, size_t mapped_bytes) const;

 private:
  uint32_t world_;
  uint32_t buckets_;
  size_t row_bytes_;
  // Within the job block.
  size_t done_offset_;
  size_t board_offset_;
  size_t job_bytes_;
  // Within a rank block.
  size_t ready_offset_;
  size_t bcast_offset_;
  size_t join_offset_;
  size_t rank_block_bytes_;
  size_t total_bytes_;
};

// Records a job failure in the job block (first failure wins) and wakes
// clients (daemon side: `base` maps every rank block).
void PublishError(const ControlLayout& layout, void* base,
                  absl::StatusCode code, std::string_view message);
// The job's failure, or OK.
absl::Status ReadError(const ControlHeader* header);

}  // namespace gradd

#endif  // GRADD_COMMON_CONTROL_BLOCK_H_
