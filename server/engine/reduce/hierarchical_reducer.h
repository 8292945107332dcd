// HierarchicalReducer: the multi-node BucketReducerInterface. Every node
// must issue the same collectives in the same order whatever order its
// buckets became ready in; Options::scheduling says how that order is made:
//
// kPlanOrder (`scheduling: none`): buckets go to the network strictly in
//   plan order (iteration i bucket b only after bucket b - 1 of iteration i
//   and the last bucket of iteration i - 1). Plan order is gradient-ready
//   order: the last layers first, the first layers' bucket, ready last,
//   waits behind everything.
// kPriority (`scheduling: priority`): within an iteration, the chunk that
//   goes next is agreed among those ready on every node, the lowest
//   BucketWork::priority (the bucket's smallest parameter index: what the
//   next forward needs first) first. The agreement is a negotiation: a
//   tiny AllreduceWith (int32 min) of each node's bitmap "the next unsent
//   chunk of bucket b is summed locally"; the buckets ready on every node
//   are sent, one chunk each, best priority first, and then the nodes
//   negotiate again, so a large bucket's later chunks yield to an earlier
//   layer's bucket that became ready meanwhile. A node joins a negotiation
//   only with at least one chunk ready; after an empty agreement it joins
//   the next only once its ready set grew or holds every remaining bucket
//   (no busy loop, no deadlock: every bucket of an iteration is eventually
//   ready on every node). No negotiation where the order is already
//   determined: once one agreed set held every remaining bucket of the
//   iteration (or one bucket is left), the rest go in priority order
//   without asking. Iteration i + 1 still starts only after all of i. Hooked
//   buckets (comm hooks) keep plan order: a reducer with a hook schedules
//   like kPlanOrder. Counted in ReducerStats (negotiations,
//   out_of_order_buckets).
//
// Two paths per bucket:
//
// float32/float64 buckets no larger than the partition (chunk_bytes; every
//   such bucket when it is 0): the network thread hands the whole bucket
//   to the backend's AllreduceAverage, which leaves the global average in
//   every local rank's bucket. GlooBackend folds the local sum and the
//   write-back into its ring, segment by segment, so they overlap the
//   transfer (see gloo_backend.h). When the network thread is still busy
//   with earlier buckets, the engine thread sums the new bucket into local
//   rank 0's bucket first (split across the pool), overlapping the
//   transfer in flight, and the backend only writes back
//   (Options::local_sum).
//
// float16/bfloat16 buckets, and larger buckets when chunk_bytes > 0:
//   engine thread   SumToAccumulator(local ranks) -> the bucket's accumulator
//                   (local rank 0's bucket itself for float32/float64,
//                   summed in place; a private float32 accumulator for the
//                   16-bit types, AccumulatorDType, allocated on first use),
//                   split across the pool; queue it for the network
//   network thread  AllreduceSum of the accumulator across nodes; then
//                   ScatterFromAccumulator (divisor = global world size)
//                   into every local rank's bucket, pool-split; then the
//                   completion
//   The network transfer of one bucket thus overlaps the local reduction of
//   the next. With chunk_bytes > 0 large buckets are also pipelined within
//   themselves: they go to the network in chunks (partitions) of
//   chunk_bytes of accumulator (the same split on every node), the engine
//   thread reducing chunk c + 1 while chunk c is on the network.
//   SetPartitionBytes changes chunk_bytes from a given iteration on.
//   Bitwise: with two nodes a chunk's sum is a + b whatever the chunk
//   boundaries; with more, GlooBackend's ring splits each call into
//   per-node segments, so which node's partial sum an element's addition
//   starts from depends on the element's offset within the call: changing
//   the partition can change the last bits of a float sum (each run is
//   still the same on every node and reproducible).
//
// Broadcasts go through the same network thread (the backend is
// single-threaded), in the order they are started. Join rounds
// (join_state.h) too, each before the first bucket of its iteration; in
// join mode a node none of whose ranks contributes to an iteration still
// runs every bucket's collective, with zeros (zero_buckets_).
//
// Owns: the backend, the store the backend reports failures through (kept
// alive for it), one accumulator per bucket, the network thread.
// Threads: Start/StartBroadcast/SetPartitionBytes on the job's engine
// thread; completions run on the network thread; stats() from any thread.
// After the first backend error every queued and later bucket completes
// with that error (the backend names the peer node). Destruction completes
// what is still queued with CANCELLED and joins the network thread; a
// collective in flight at that moment is waited for, bounded by the
// backend's collective timeout. The backend is destroyed (GlooBackend:
// closed) right after the network thread ends, so peers blocked on this
// node fail at once instead of at their timeout.
#ifndef GRADD_SERVER_ENGINE_REDUCE_HIERARCHICAL_REDUCER_H_
#define GRADD_SERVER_ENGINE_REDUCE_HIERARCHICAL_REDUCER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <memory>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/thread_pool.h"
#include "server/backends/collective_backend.h"
#include "server/engine/reduce/bucket_reducer.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {

class HierarchicalReducer final : public BucketReducerInterface {
 public:
  struct Options {
    // Shared reduce pool (may be null: reduce on the calling thread); must
    // outlive the reducer.
    ThreadPool* pool = nullptr;
    int num_buckets = 0;
    // Global rank offset of each node, by node rank; the job's world size.
    std::vector<int> node_offsets;
    int world_size = 1;
    // Accumulator bytes per network chunk (partition) of a large bucket;
    // 0: whole buckets. Must be the same on every node of a job.
    size_t chunk_bytes = kDefaultChunkBytes;
    // The order buckets go to the network in (see above). Must be the same
    // on every node of a job.
    enum class Scheduling { kPlanOrder, kPriority };
    Scheduling scheduling = Scheduling::kPlanOrder;
    // Whole float32/float64 buckets (chunk_bytes 0) are averaged by the
    // backend's AllreduceAverage. Where their local sum happens:
    //   kAuto         on the engine thread (across the pool) while the
    //                 network thread is busy with earlier buckets, so it
    //                 overlaps that transfer; otherwise inside the
    //                 backend's network schedule
    //   kEngineThread always on the engine thread first
    //   kNetwork      always inside the backend's schedule
    enum class LocalSum { kAuto, kEngineThread, kNetwork };
    LocalSum local_sum = LocalSum::kAuto;
    // Where AgreeCommHook meets the other nodes: the job's namespace of
    // `store` and a key prefix unique to this formation round.
    std::string job_id;
    std::string store_prefix;
    absl::Duration agree_timeout = absl::Seconds(30);
  };
  // Off by default: on the 2-core development machine, where the "network"
  // is loopback TCP and every phase competes for the same cores and memory
  // bandwidth, 25 MiB buckets with 2 nodes x 2 trainers took 52-58 ms whole
  // and 63-105 ms in 1-8 MiB chunks (Gloo's per-call cost, no idle resource
  // to overlap with). Worth enabling where the network is a real link.
  static constexpr size_t kDefaultChunkBytes = 0;

  // `store` may be null; otherwise it outlives `backend` (the backend uses
  // it to find out which peer failed).
  HierarchicalReducer(
      Options options, std::unique_ptr<CollectiveBackendInterface> backend,
      std::unique_ptr<RendezvousStoreInterface> store = nullptr);
  ~HierarchicalReducer() override;

  HierarchicalReducer(const HierarchicalReducer&) = delete;
  HierarchicalReducer& operator=(const HierarchicalReducer&) = delete;

  void Start(const BucketWork& work, Completion done) override;
  void StartBroadcast(const BroadcastWork& work, Completion done) override;
  void StartJoinRound(JoinRoundWork work, RoundCompletion done) override;
  ReducerStats stats() const override;
  void Replan(uint64_t first_iteration, int num_buckets) override;
  void StartAt(uint64_t first_iteration) override;
  void SetPartitionBytes(uint64_t first_iteration, size_t bytes) override;
  // A hooked bucket goes to the network thread whole, in plan order, and
  // the hook does its local reduce, collectives and write-back there.
  [[nodiscard]] absl::Status SetCommHook(
      std::unique_ptr<CommHookInterface> hook) override;
  // Through the rendezvous store (no store: OK): each node publishes its
  // network schedule (scheduling, partition_mb: Options::scheduling and
  // chunk_bytes) under "<store_prefix>/schedule/<node rank>", then its hook
  // description under "<store_prefix>/comm_hook/<node rank>", and reads the
  // others', within agree_timeout. Nodes configured with a different
  // schedule fail the job (INVALID_ARGUMENT naming both nodes and values)
  // before its first bucket, as nodes with different hooks do; the Job
  // calls this for every new reducer (formation and re-formation).
  [[nodiscard]] absl::Status AgreeCommHook(
      const std::string& description) override;

 private:
  // One setting published as "<store_prefix>/<name>/<node rank>" and
  // compared with every other node's.
  absl::Status AgreeAcrossNodes(const std::string& name,
                                const std::string& what,
                                const std::string& description);
  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };
  // One bucket in flight: its completion runs once every chunk has been
  // through the network (or failed / was cancelled). Network thread only.
  struct BucketState {
    BucketWork work;
    Completion done;
    int chunks_left = 0;
    absl::Status status;
    // Where the node's partial sum lives: local rank 0's bucket (float32 and
    // float64 buckets: summed in place) or accumulators_[bucket].
    void* acc = nullptr;
  };
  // One chunk: elements [begin, end) of a bucket.
  struct Item {
    std::shared_ptr<BucketState> bucket;
    int chunk = 0;
    int num_chunks = 1;
    size_t begin = 0;
    size_t end = 0;
    // Whole float32/float64 bucket averaged by the backend's
    // AllreduceAverage (local sum and write-back folded into the network
    // schedule); `to_sum` local buffers still to be summed (1: the engine
    // thread already summed them into local rank 0's bucket).
    bool fused = false;
    int to_sum = 0;
    // Whole bucket handed to hook_ on the network thread.
    bool hooked = false;
  };
  using ChunkKey = std::tuple<uint64_t, int, int>;  // iteration, bucket, chunk
  struct BroadcastItem {
    BroadcastWork work;
    Completion done;
  };
  struct RoundItem {
    JoinRoundWork work;
    RoundCompletion done;
  };

  // Sums the local ranks' elements [begin, end) of `work` into `acc`
  // across the pool, counted as local reduce time.
  void SumLocally(const BucketWork& work, void* acc, size_t begin, size_t end);
  // Queues a chunk (or whole fused bucket) for the network thread.
  void Enqueue(Item item);
  void NetworkLoop();
  // kPriority: buckets per iteration, and the current iteration's
  // bookkeeping reset when the iteration (or its plan) changed.
  int BucketsIn(uint64_t iteration) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SyncSchedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // kPriority: the current iteration's next unsent chunk of bucket b, if
  // summed locally; ready_.end() otherwise.
  absl::flat_hash_map<ChunkKey, Item>::iterator NextChunkOf(int b)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // kPriority: the agreed chunk to send now (ready_.end(): none yet), and
  // whether this node should negotiate now.
  absl::flat_hash_map<ChunkKey, Item>::iterator ScheduledChunk()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ShouldNegotiate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // kPriority, network thread, mu_ not held: one negotiation over
  // `bitmap`; on success the agreed buckets (schedule_.batch, or the whole
  // rest of the iteration in schedule_.settled).
  absl::Status Negotiate(std::vector<int32_t> bitmap, uint64_t generation);
  // kPriority: `item` (of the current iteration) went to the network.
  void CountSent(const Item& item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // kPriority and no hook (and not broken: then order no longer matters).
  bool Prioritized() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return options_.scheduling == Options::Scheduling::kPriority && !hooked_ &&
           !failed_;
  }
  // No chunk of next_iteration_ went to the network yet.
  bool AtIterationStart() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Engine thread: the partition (chunk bytes) of `iteration`.
  size_t PartitionFor(uint64_t iteration) const;
  void RunChunk(Item& item);
  // Counts a chunk done with `status`; completes the bucket after its last.
  void FinishChunk(Item& item, absl::Status status);
  void RunBroadcast(BroadcastItem& item);
  // A collective round other than broadcast (area_collective.h): the
  // nodes check they run the same round (AgreeRound), then the local
  // reduce / gather, one AllreduceWith, the write-back.
  void RunAreaCollective(BroadcastItem& item);
  absl::Status AgreeRound(const BroadcastWork& work);

  const Options options_;
  // Declared before backend_: destroyed after it.
  const std::unique_ptr<RendezvousStoreInterface> store_;
  const std::unique_ptr<CollectiveBackendInterface> backend_;

  // accumulators_[b]: for 16-bit buckets only, allocated by the engine
  // thread on bucket b's first Start, then handed back and forth with the
  // bucket (the engine never starts b again before b's completion), so it
  // needs no lock.
  std::vector<std::unique_ptr<void, FreeDeleter>> accumulators_;
  // zero_buckets_[b]: bucket b's zeros for iterations in which no local rank
  // contributes (join), and {that pointer} as the bucket's rank buffers;
  // engine thread, handed over with the bucket like accumulators_.
  std::vector<std::unique_ptr<void, FreeDeleter>> zero_buckets_;
  std::vector<std::vector<void*>> zero_ptrs_;
  // Set by the engine thread before the first Start (hand-off through mu_
  // with the first bucket); used by the network thread only after that.
  std::unique_ptr<CommHookInterface> hook_;

  absl::Mutex mu_;
  // Chunks reduced locally, waiting for their turn on the network.
  absl::flat_hash_map<ChunkKey, Item> ready_ ABSL_GUARDED_BY(mu_);
  std::deque<BroadcastItem> broadcasts_ ABSL_GUARDED_BY(mu_);
  // Join rounds, each run before bucket 0 of its iteration.
  std::deque<RoundItem> rounds_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // hook_ != nullptr, for the network thread's wait condition.
  bool hooked_ ABSL_GUARDED_BY(mu_) = false;
  // Mirrors !broken_.ok() for the wait condition (evaluated on any thread).
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  // The network thread is running a collective.
  bool network_busy_ ABSL_GUARDED_BY(mu_) = false;
  // Buckets per iteration: options_.num_buckets, then replan_num_buckets_
  // from iteration replan_iteration_ on (0: no replan; bucket rebuild).
  uint64_t replan_iteration_ ABSL_GUARDED_BY(mu_) = 0;
  int replan_num_buckets_ ABSL_GUARDED_BY(mu_) = 0;

  // kPriority bookkeeping of iteration `iteration` (guarded: StartAt and
  // Replan run on the engine thread).
  struct Schedule {
    uint64_t iteration = 0;
    // Per bucket: chunks sent, chunks in all (0: not seen yet), priority.
    std::vector<int> sent;
    std::vector<int> total;
    std::vector<int64_t> priority;
    int buckets_left = 0;
    int chunks_sent = 0;
    // The lowest bucket none of whose chunks was sent (out-of-order count).
    int plan_next = 0;
    // Agreed buckets still to send one chunk each, best priority first.
    std::deque<int> batch;
    // Every remaining bucket agreed: the rest go in this order, whole.
    bool settled = false;
    std::deque<int> settled_order;
    // The last negotiation agreed on nothing: wait for enqueued_ to move
    // past this (or for this node to hold every remaining bucket).
    bool waiting = false;
    uint64_t waited_generation = 0;
    // Negotiations since a chunk last went out (credited to the next one's
    // BucketTiming).
    int unattributed = 0;
  };
  Schedule schedule_ ABSL_GUARDED_BY(mu_);
  // Enqueue calls so far (wakes a node waiting after an empty agreement).
  uint64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  // Engine thread only: (first iteration, chunk bytes), ascending.
  std::vector<std::pair<uint64_t, size_t>> partitions_;

  // Network thread only (StartAt sets them under mu_ before anything is
  // queued): the next (iteration, bucket, chunk) to go to the network.
  uint64_t next_iteration_ = 1;
  int next_bucket_ = 0;
  int next_chunk_ = 0;
  // Network thread only: the first backend error, returned from then on.
  absl::Status broken_;
  // Network thread only: a collective round's accumulator / gather buffer.
  std::vector<char> collective_scratch_;

  std::atomic<uint64_t> buckets_{0};
  std::atomic<uint64_t> local_reduce_ns_{0};
  std::atomic<uint64_t> network_ns_{0};
  std::atomic<uint64_t> write_back_ns_{0};
  std::atomic<uint64_t> negotiations_{0};
  std::atomic<uint64_t> out_of_order_{0};

  std::thread thread_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_REDUCE_HIERARCHICAL_REDUCER_H_
