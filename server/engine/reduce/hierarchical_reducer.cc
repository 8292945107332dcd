#include "server/engine/reduce/hierarchical_reducer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/reduce.h"
#include "common/split_across_pool.h"
#include "common/status_macros.h"
#include "server/engine/reduce/area_collective.h"

namespace gradd {
namespace {

// Accumulators start on a cache line (and a vector register's alignment).
constexpr size_t kAccAlignment = 64;
// The network thread re-checks stop at least this often while idle.
constexpr absl::Duration kIdleWait = absl::Milliseconds(200);

using Clock = std::chrono::steady_clock;

uint64_t NanosSince(Clock::time_point start) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start)
          .count());
}

// The time since `start` (engine clock), also added to the bucket's
// `phase` when the engine asked for its timing.
uint64_t Record(BucketTiming* timing, PhaseSpan BucketTiming::*phase,
                int64_t start) {
  const int64_t ns = EngineNowNs() - start;
  if (timing != nullptr) (timing->*phase).Add(start, ns);
  return static_cast<uint64_t>(ns);
}

}  // namespace

HierarchicalReducer::HierarchicalReducer(
    Options options, std::unique_ptr<CollectiveBackendInterface> backend,
    std::unique_ptr<RendezvousStoreInterface> store)
    : options_(std::move(options)),
      store_(std::move(store)),
      backend_(std::move(backend)),
      accumulators_(options_.num_buckets),
      zero_buckets_(options_.num_buckets),
      zero_ptrs_(options_.num_buckets) {
  thread_ = std::thread([this] { NetworkLoop(); });
}

HierarchicalReducer::~HierarchicalReducer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

absl::Status HierarchicalReducer::AgreeCommHook(
    const std::string& description) {
  // The network schedule is part of the sequence of collectives too.
  const char* const scheduling =
      options_.scheduling == Options::Scheduling::kPriority ? "priority"
                                                            : "none";
  RETURN_IF_ERROR(AgreeAcrossNodes(
      "schedule", "network schedule",
      absl::StrCat("scheduling: ", scheduling, ", partition_mb: ",
                   static_cast<double>(options_.chunk_bytes) / (1 << 20))));
  return AgreeAcrossNodes("comm_hook", "communication hook", description);
}

absl::Status HierarchicalReducer::AgreeAcrossNodes(
    const std::string& name, const std::string& what,
    const std::string& description) {
  const int nodes = static_cast<int>(options_.node_offsets.size());
  if (store_ == nullptr || nodes <= 1) return absl::OkStatus();
  const int me = backend_->node_rank();
  auto key = [&](int node) {
    return absl::StrCat(options_.store_prefix, "/", name, "/", node);
  };
  if (absl::Status s = store_->Set(options_.job_id, key(me), description);
      !s.ok()) {
    return s;
  }
  const absl::Time deadline = absl::Now() + options_.agree_timeout;
  for (int k = 0; k < nodes; ++k) {
    if (k == me) continue;
    absl::StatusOr<std::string> theirs =
        store_->Get(options_.job_id, key(k),
                    std::max(deadline - absl::Now(), absl::Milliseconds(1)));
    if (!theirs.ok()) {
      return absl::Status(
          theirs.status().code(),
          absl::StrCat("waiting for ", backend_->NodeName(k), " to choose its ",
                       what, ": ", theirs.status().message()));
    }
    if (*theirs != description) {
      return absl::InvalidArgumentError(
          absl::StrCat("nodes disagree on the ", what, ": ",
                       backend_->NodeName(me), " uses '", description, "' but ",
                       backend_->NodeName(k), " uses '", *theirs, "'"));
    }
  }
  return absl::OkStatus();
}

void HierarchicalReducer::Start(const BucketWork& given, Completion done) {
  BucketWork work = given;
  if (work.rank_buffers->empty()) {
    // No local rank contributes (they all joined): the node still takes
    // part in the bucket's collective, with zeros of its own, so that the
    // other nodes' sequence of collectives is matched. Written back into
    // and then ignored.
    std::unique_ptr<void, FreeDeleter>& zero = zero_buckets_[work.bucket];
    const size_t bytes = std::max<size_t>(
        kAccAlignment,
        (work.count * DTypeSize(work.dtype) + kAccAlignment - 1) /
            kAccAlignment * kAccAlignment);
    if (zero == nullptr) {
      zero.reset(std::aligned_alloc(kAccAlignment, bytes));
      if (zero == nullptr) {
        std::move(done)(absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate the ", bytes,
                         "-byte zero bucket of bucket ", work.bucket)));
        return;
      }
      zero_ptrs_[work.bucket] = {zero.get()};
    }
    std::memset(zero.get(), 0, bytes);
    work.rank_buffers = &zero_ptrs_[work.bucket];
  }
  if (hook_ != nullptr && !work.internal) {
    Item item;
    item.hooked = true;
    item.bucket = std::make_shared<BucketState>();
    item.bucket->work = work;
    item.bucket->done = std::move(done);
    item.bucket->chunks_left = 1;
    Enqueue(std::move(item));
    return;
  }
  const DType acc_type = AccumulatorDType(work.dtype);
  const size_t acc_elem = DTypeSize(acc_type);
  const std::vector<void*>& buffers = *work.rank_buffers;
  const int n = static_cast<int>(buffers.size());
  void* acc_data = nullptr;
  // Partitions depend only on the plan and the partition size agreed for
  // the iteration, so every node splits a bucket the same way.
  const size_t partition = PartitionFor(work.iteration);
  if (acc_type == work.dtype && n > 0 &&
      (partition == 0 || work.count * acc_elem <= partition)) {
    // The backend averages the whole bucket, folding the local sum and the
    // write-back into its network schedule. If the network thread is busy
    // with earlier buckets, sum this one now instead (into local rank 0's
    // bucket, across the pool) so that work overlaps the transfer in
    // flight; the backend then has only the write-back left to fold in.
    bool sum_here = options_.local_sum == Options::LocalSum::kEngineThread;
    if (options_.local_sum == Options::LocalSum::kAuto) {
      absl::MutexLock lock(&mu_);
      sum_here = network_busy_ || !ready_.empty();
    }
    Item item;
    item.fused = true;
    item.to_sum = n;
    if (sum_here && n > 1) {
      SumLocally(work, buffers[0], 0, work.count);
      item.to_sum = 1;
    }
    item.bucket = std::make_shared<BucketState>();
    item.bucket->work = work;
    item.bucket->done = std::move(done);
    item.bucket->chunks_left = 1;
    item.bucket->acc = buffers[0];
    Enqueue(std::move(item));
    return;
  }
  if (acc_type == work.dtype && n > 0) {
    // Sum in place into local rank 0's bucket, allreduce it there, and
    // write back from it: no private accumulator, one stream of memory
    // traffic less in each local pass (and none at all with one local
    // rank). Until the completion, rank 0's bucket holds the partial sum;
    // the trainers read it only after done (or get the job's error).
    acc_data = buffers[0];
  } else {
    std::unique_ptr<void, FreeDeleter>& acc = accumulators_[work.bucket];
    if (acc == nullptr) {
      const size_t bytes = std::max<size_t>(
          kAccAlignment, (work.count * acc_elem + kAccAlignment - 1) /
                             kAccAlignment * kAccAlignment);
      acc.reset(std::aligned_alloc(kAccAlignment, bytes));
      if (acc == nullptr) {
        std::move(done)(absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate the ", bytes,
                         "-byte accumulator of bucket ", work.bucket)));
        return;
      }
    }
    acc_data = acc.get();
  }
  // Whole multiples of 64 elements keep chunks on cache lines.
  size_t per_chunk = work.count;
  if (partition > 0) {
    per_chunk = std::max<size_t>(64, partition / acc_elem / 64 * 64);
  }
  const int num_chunks =
      work.count == 0
          ? 1
          : static_cast<int>((work.count + per_chunk - 1) / per_chunk);
  auto state = std::make_shared<BucketState>();
  state->work = work;
  state->done = std::move(done);
  state->chunks_left = num_chunks;
  state->acc = acc_data;

  for (int c = 0; c < num_chunks; ++c) {
    Item item;
    item.bucket = state;
    item.chunk = c;
    item.num_chunks = num_chunks;
    item.begin = std::min(work.count, c * per_chunk);
    item.end = std::min(work.count, item.begin + per_chunk);
    SumLocally(work, acc_data, item.begin, item.end);
    // Handed over chunk by chunk: the network starts on chunk 0 while this
    // thread reduces chunk 1.
    Enqueue(std::move(item));
  }
}

void HierarchicalReducer::SumLocally(const BucketWork& work, void* acc,
                                     size_t begin, size_t end) {
  const int64_t start = EngineNowNs();
  const std::vector<void*>& buffers = *work.rank_buffers;
  const int n = static_cast<int>(buffers.size());
  SplitAcrossPool(options_.pool, work.dtype, begin, end,
                  [&](size_t b, size_t e) {
                    SumToAccumulator(work.dtype, buffers.data(), n, acc, b, e);
                  });
  local_reduce_ns_.fetch_add(
      Record(work.timing, &BucketTiming::local_reduce, start),
      std::memory_order_relaxed);
}

void HierarchicalReducer::Enqueue(Item item) {
  const ChunkKey key(item.bucket->work.iteration, item.bucket->work.bucket,
                     item.chunk);
  absl::MutexLock lock(&mu_);
  ready_.emplace(key, std::move(item));
  ++enqueued_;
}

absl::Status HierarchicalReducer::SetCommHook(
    std::unique_ptr<CommHookInterface> hook) {
  hook_ = std::move(hook);
  absl::MutexLock lock(&mu_);
  hooked_ = hook_ != nullptr;
  return absl::OkStatus();
}

void HierarchicalReducer::SetPartitionBytes(uint64_t first_iteration,
                                            size_t bytes) {
  while (!partitions_.empty() && partitions_.back().first >= first_iteration) {
    partitions_.pop_back();
  }
  partitions_.emplace_back(first_iteration, bytes);
}

size_t HierarchicalReducer::PartitionFor(uint64_t iteration) const {
  for (auto it = partitions_.rbegin(); it != partitions_.rend(); ++it) {
    if (it->first <= iteration) return it->second;
  }
  return options_.chunk_bytes;
}

void HierarchicalReducer::StartBroadcast(const BroadcastWork& work,
                                         Completion done) {
  absl::MutexLock lock(&mu_);
  broadcasts_.push_back(BroadcastItem{work, std::move(done)});
}

void HierarchicalReducer::StartJoinRound(JoinRoundWork work,
                                         RoundCompletion done) {
  absl::MutexLock lock(&mu_);
  rounds_.push_back(RoundItem{std::move(work), std::move(done)});
}

ReducerStats HierarchicalReducer::stats() const {
  ReducerStats s;
  s.buckets = buckets_.load(std::memory_order_relaxed);
  s.local_reduce_ns = local_reduce_ns_.load(std::memory_order_relaxed);
  s.network_ns = network_ns_.load(std::memory_order_relaxed);
  s.write_back_ns = write_back_ns_.load(std::memory_order_relaxed);
  s.negotiations = negotiations_.load(std::memory_order_relaxed);
  s.out_of_order_buckets = out_of_order_.load(std::memory_order_relaxed);
  return s;
}

void HierarchicalReducer::Replan(uint64_t first_iteration, int num_buckets) {
  // The old plan's 16-bit accumulators and join zero buckets have the old
  // buckets' sizes.
  accumulators_.clear();
  accumulators_.resize(num_buckets);
  zero_buckets_.clear();
  zero_buckets_.resize(num_buckets);
  zero_ptrs_.assign(num_buckets, {});
  absl::MutexLock lock(&mu_);
  replan_iteration_ = first_iteration;
  replan_num_buckets_ = num_buckets;
}

void HierarchicalReducer::StartAt(uint64_t first_iteration) {
  absl::MutexLock lock(&mu_);
  next_iteration_ = first_iteration;
  schedule_ = Schedule();
  next_bucket_ = 0;
  next_chunk_ = 0;
}

int HierarchicalReducer::BucketsIn(uint64_t iteration) const {
  return replan_iteration_ != 0 && iteration >= replan_iteration_
             ? replan_num_buckets_
             : options_.num_buckets;
}

bool HierarchicalReducer::AtIterationStart() const {
  if (Prioritized()) {
    return schedule_.iteration != next_iteration_ || schedule_.chunks_sent == 0;
  }
  return next_bucket_ == 0 && next_chunk_ == 0;
}

void HierarchicalReducer::SyncSchedule() {
  Schedule& s = schedule_;
  const int buckets = BucketsIn(next_iteration_);
  // A new iteration, or a Replan before anything of this one was sent.
  if (s.iteration == next_iteration_ &&
      (s.chunks_sent > 0 || static_cast<int>(s.sent.size()) == buckets)) {
    return;
  }
  s = Schedule();
  s.iteration = next_iteration_;
  s.sent.assign(buckets, 0);
  s.total.assign(buckets, 0);
  s.priority.assign(buckets, 0);
  s.buckets_left = buckets;
}

absl::flat_hash_map<HierarchicalReducer::ChunkKey,
                    HierarchicalReducer::Item>::iterator
HierarchicalReducer::NextChunkOf(int b) {
  const Schedule& s = schedule_;
  if (s.total[b] != 0 && s.sent[b] >= s.total[b]) return ready_.end();
  return ready_.find(ChunkKey(s.iteration, b, s.sent[b]));
}

absl::flat_hash_map<HierarchicalReducer::ChunkKey,
                    HierarchicalReducer::Item>::iterator
HierarchicalReducer::ScheduledChunk() {
  SyncSchedule();
  Schedule& s = schedule_;
  if (!s.settled && s.batch.empty() && s.buckets_left == 1) {
    // One bucket left: nothing to choose.
    for (int b = 0; b < static_cast<int>(s.sent.size()); ++b) {
      if (s.total[b] == 0 || s.sent[b] < s.total[b]) {
        s.settled = true;
        s.settled_order = {b};
        break;
      }
    }
  }
  if (s.settled) {
    while (!s.settled_order.empty() && s.total[s.settled_order.front()] != 0 &&
           s.sent[s.settled_order.front()] >=
               s.total[s.settled_order.front()]) {
      s.settled_order.pop_front();
    }
    if (s.settled_order.empty()) return ready_.end();
    return NextChunkOf(s.settled_order.front());
  }
  if (!s.batch.empty()) return NextChunkOf(s.batch.front());
  return ready_.end();
}

bool HierarchicalReducer::ShouldNegotiate() {
  SyncSchedule();
  const Schedule& s = schedule_;
  if (s.settled || !s.batch.empty() || s.buckets_left <= 1) return false;
  bool any = false;
  bool all = true;
  for (int b = 0; b < static_cast<int>(s.sent.size()); ++b) {
    if (s.total[b] != 0 && s.sent[b] >= s.total[b]) continue;
    const bool ready = NextChunkOf(b) != ready_.end();
    any = any || ready;
    all = all && ready;
  }
  if (!any) return false;
  // After an empty agreement: only once something new is ready here, or
  // this node holds everything (then the others must catch up, and they
  // will join once their own sets grew).
  return !s.waiting || all || enqueued_ != s.waited_generation;
}

absl::Status HierarchicalReducer::Negotiate(std::vector<int32_t> bitmap,
                                            uint64_t generation) {
  negotiations_.fetch_add(1, std::memory_order_relaxed);
  const Clock::time_point start = Clock::now();
  absl::Status st = backend_->AllreduceWith(
      bitmap.data(), bitmap.size(), sizeof(int32_t),
      CombineFunction(CollectiveDType::kInt32, CollectiveOp::kMin));
  network_ns_.fetch_add(NanosSince(start), std::memory_order_relaxed);
  if (!st.ok()) return st;
  absl::MutexLock lock(&mu_);
  Schedule& s = schedule_;
  std::vector<int> agreed;
  int unsent = 0;
  for (int b = 0; b < static_cast<int>(bitmap.size()); ++b) {
    if (s.total[b] == 0 || s.sent[b] < s.total[b]) ++unsent;
    if (bitmap[b] != 0) agreed.push_back(b);
  }
  ++s.unattributed;
  if (agreed.empty()) {
    s.waiting = true;
    s.waited_generation = generation;
    return absl::OkStatus();
  }
  s.waiting = false;
  std::sort(agreed.begin(), agreed.end(), [&s](int a, int b) {
    return std::make_pair(s.priority[a], a) < std::make_pair(s.priority[b], b);
  });
  if (static_cast<int>(agreed.size()) == unsent) {
    s.settled = true;
    s.settled_order.assign(agreed.begin(), agreed.end());
  } else {
    s.batch.assign(agreed.begin(), agreed.end());
  }
  return absl::OkStatus();
}

void HierarchicalReducer::CountSent(const Item& item) {
  Schedule& s = schedule_;
  const int b = item.bucket->work.bucket;
  BucketTiming* timing = item.bucket->work.timing;
  if (s.sent[b] == 0 && b > s.plan_next) {
    out_of_order_.fetch_add(1, std::memory_order_relaxed);
    if (timing != nullptr) timing->out_of_order = true;
  }
  if (timing != nullptr) timing->negotiations += s.unattributed;
  s.unattributed = 0;
  s.total[b] = item.num_chunks;
  s.priority[b] = item.bucket->work.priority;
  ++s.sent[b];
  ++s.chunks_sent;
  if (!s.batch.empty() && s.batch.front() == b) s.batch.pop_front();
  if (s.sent[b] == s.total[b]) --s.buckets_left;
  while (s.plan_next < static_cast<int>(s.sent.size()) &&
         s.sent[s.plan_next] > 0) {
    ++s.plan_next;
  }
  if (s.buckets_left == 0) {
    ++next_iteration_;
    next_bucket_ = 0;
    next_chunk_ = 0;
  }
}

void HierarchicalReducer::NetworkLoop() {
  while (true) {
    std::optional<Item> item;
    std::optional<BroadcastItem> bcast;
    std::optional<RoundItem> round;
    bool stopping = false;
    // kPriority: the item was picked by the schedule (its bookkeeping is
    // done); or this node negotiates over `bitmap`.
    bool scheduled = false;
    bool negotiate = false;
    std::vector<int32_t> bitmap;
    uint64_t generation = 0;
    {
      absl::MutexLock lock(&mu_);
      // Once broken, order no longer matters: every bucket fails at once.
      auto next = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (failed_ && !ready_.empty()) return ready_.begin();
        if (Prioritized()) return ScheduledChunk();
        return ready_.find(
            ChunkKey(next_iteration_, next_bucket_, next_chunk_));
      };
      // A round goes before the first bucket of its iteration (or at once
      // when broken: it fails like everything else).
      auto round_due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !rounds_.empty() &&
               (failed_ || (rounds_.front().work.iteration == next_iteration_ &&
                            AtIterationStart()));
      };
      auto has_work = [this, &next,
                       &round_due]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !broadcasts_.empty() || round_due() ||
               next() != ready_.end() || (Prioritized() && ShouldNegotiate());
      };
      mu_.AwaitWithTimeout(absl::Condition(&has_work), kIdleWait);
      stopping = stop_;
      if (!broadcasts_.empty()) {
        bcast.emplace(std::move(broadcasts_.front()));
        broadcasts_.pop_front();
      } else if (round_due()) {
        round.emplace(std::move(rounds_.front()));
        rounds_.pop_front();
      } else if (auto it = next(); it != ready_.end()) {
        if (Prioritized()) {
          CountSent(it->second);
          scheduled = true;
        }
        item.emplace(std::move(it->second));
        ready_.erase(it);
      } else if (!stopping && Prioritized() && ShouldNegotiate()) {
        negotiate = true;
        generation = enqueued_;
        const Schedule& s = schedule_;
        bitmap.assign(s.sent.size(), 0);
        for (int b = 0; b < static_cast<int>(bitmap.size()); ++b) {
          auto chunk = NextChunkOf(b);
          if (chunk == ready_.end()) continue;
          bitmap[b] = 1;
          schedule_.priority[b] = chunk->second.bucket->work.priority;
          schedule_.total[b] = chunk->second.num_chunks;
        }
      }
      network_busy_ =
          bcast.has_value() || item.has_value() || round.has_value();
    }
    if (stopping) {
      // Nobody will wait for these any more, but each completion runs once.
      if (item) FinishChunk(*item, absl::CancelledError("reducer stopped"));
      if (bcast)
        std::move(bcast->done)(absl::CancelledError("reducer stopped"));
      absl::MutexLock lock(&mu_);
      for (auto& [key, rest] : ready_) {
        FinishChunk(rest, absl::CancelledError("reducer stopped"));
      }
      ready_.clear();
      for (BroadcastItem& rest : broadcasts_) {
        std::move(rest.done)(absl::CancelledError("reducer stopped"));
      }
      broadcasts_.clear();
      if (round) {
        std::move(round->done)(absl::CancelledError("reducer stopped"), {});
      }
      for (RoundItem& rest : rounds_) {
        std::move(rest.done)(absl::CancelledError("reducer stopped"), {});
      }
      rounds_.clear();
      break;
    }
    if (negotiate && broken_.ok()) {
      absl::Status s = Negotiate(std::move(bitmap), generation);
      if (!s.ok()) broken_ = std::move(s);
    }
    if (bcast) RunBroadcast(*bcast);
    if (round) {
      if (broken_.ok()) {
        const Clock::time_point start = Clock::now();
        absl::Status s =
            backend_->AllreduceSum(round->work.values.data(),
                                   round->work.values.size(), DType::kFloat64);
        network_ns_.fetch_add(NanosSince(start), std::memory_order_relaxed);
        if (!s.ok()) broken_ = std::move(s);
      }
      std::move(round->done)(broken_, std::move(round->work.values));
    }
    const int num_chunks = item ? item->num_chunks : 0;
    if (item) RunChunk(*item);
    {
      absl::MutexLock lock(&mu_);
      if (item && !scheduled && ++next_chunk_ == num_chunks) {
        next_chunk_ = 0;
        if (++next_bucket_ >= BucketsIn(next_iteration_)) {
          next_bucket_ = 0;
          ++next_iteration_;
        }
      }
      network_busy_ = false;
      if (!broken_.ok()) failed_ = true;
    }
  }
}

void HierarchicalReducer::RunChunk(Item& item) {
  const BucketWork& work = item.bucket->work;
  const DType acc_type = AccumulatorDType(work.dtype);
  char* acc = static_cast<char*>(item.bucket->acc);
  if (item.hooked) {
    if (broken_.ok()) {
      const int64_t start = EngineNowNs();
      CommHookWork hook_work;
      hook_work.bucket = work.bucket;
      hook_work.iteration = work.iteration;
      hook_work.dtype = work.dtype;
      hook_work.count = work.count;
      hook_work.rank_buffers = work.rank_buffers;
      absl::Status s = hook_->Run(hook_work, *backend_);
      network_ns_.fetch_add(Record(work.timing, &BucketTiming::network, start),
                            std::memory_order_relaxed);
      if (!s.ok()) broken_ = std::move(s);
    }
    FinishChunk(item, broken_);
    return;
  }
  if (item.fused) {
    if (broken_.ok()) {
      const int64_t start = EngineNowNs();
      LocalAverage average;
      average.dtype = work.dtype;
      average.buffers = *work.rank_buffers;
      average.to_sum = item.to_sum;
      average.count = work.count;
      average.divisor = work.divisor > 0 ? work.divisor : options_.world_size;
      absl::Status s = backend_->AllreduceAverage(average);
      network_ns_.fetch_add(Record(work.timing, &BucketTiming::network, start),
                            std::memory_order_relaxed);
      if (!s.ok()) broken_ = std::move(s);
    }
    FinishChunk(item, broken_);
    return;
  }
  if (broken_.ok()) {
    const int64_t start = EngineNowNs();
    absl::Status s =
        backend_->AllreduceSum(acc + item.begin * DTypeSize(acc_type),
                               item.end - item.begin, acc_type);
    network_ns_.fetch_add(Record(work.timing, &BucketTiming::network, start),
                          std::memory_order_relaxed);
    if (!s.ok()) broken_ = std::move(s);
  }
  if (!broken_.ok()) {
    FinishChunk(item, broken_);
    return;
  }
  const int64_t start = EngineNowNs();
  const std::vector<void*>& buffers = *work.rank_buffers;
  const int n = static_cast<int>(buffers.size());
  const double divisor = work.divisor > 0 ? work.divisor : options_.world_size;
  SplitAcrossPool(options_.pool, work.dtype, item.begin, item.end,
                  [&](size_t begin, size_t end) {
                    ScatterFromAccumulator(work.dtype, acc, divisor,
                                           buffers.data(), n, begin, end);
                  });
  write_back_ns_.fetch_add(
      Record(work.timing, &BucketTiming::write_back, start),
      std::memory_order_relaxed);
  FinishChunk(item, absl::OkStatus());
}

void HierarchicalReducer::FinishChunk(Item& item, absl::Status status) {
  BucketState& bucket = *item.bucket;
  if (bucket.status.ok()) bucket.status = std::move(status);
  if (--bucket.chunks_left > 0) return;
  if (bucket.status.ok()) buckets_.fetch_add(1, std::memory_order_relaxed);
  std::move(bucket.done)(std::move(bucket.status));
}

void HierarchicalReducer::RunBroadcast(BroadcastItem& item) {
  const BroadcastWork& work = item.work;
  if (work.kind != CollectiveKind::kBroadcast) {
    RunAreaCollective(item);
    return;
  }
  const std::vector<void*>& areas = *work.rank_areas;
  const int local_world = static_cast<int>(areas.size());
  // The node holding global rank `root`: the one with the highest offset
  // that is <= it. Offsets need not rise with node rank: after a
  // re-formation an admitted node that gets its old offsets back comes
  // last in node-rank order (reformation.h), e.g. offsets [1, 2, 0].
  int root_node = 0;
  int root_offset = -1;
  for (size_t k = 0; k < options_.node_offsets.size(); ++k) {
    const int offset = options_.node_offsets[k];
    if (offset <= work.root && offset > root_offset) {
      root_node = static_cast<int>(k);
      root_offset = offset;
    }
  }
  const bool here = root_node == backend_->node_rank();
  // Not the root's node: receive into the first rank that takes part.
  int local_root = 0;
  if (here) {
    local_root = work.root - options_.node_offsets[root_node];
  } else {
    while (local_root < local_world && areas[local_root] == nullptr) {
      ++local_root;
    }
  }
  if (local_root < 0 || local_root >= local_world ||
      areas[local_root] == nullptr) {
    std::move(item.done)(absl::InternalError(
        absl::StrCat("broadcast ", work.seq, ": root rank ", work.root,
                     " maps to local rank ", local_root, " of ", local_world)));
    return;
  }
  if (broken_.ok()) {
    // In place: the root node sends straight from its local root's area,
    // the others receive into local rank 0's and copy from there.
    absl::Status s =
        backend_->Broadcast(areas[local_root], work.bytes, root_node);
    if (!s.ok()) broken_ = std::move(s);
  }
  if (!broken_.ok()) {
    std::move(item.done)(broken_);
    return;
  }
  for (int r = 0; r < local_world; ++r) {
    if (r != local_root && areas[r] != nullptr) {
      std::memcpy(areas[r], areas[local_root], work.bytes);
    }
  }
  std::move(item.done)(absl::OkStatus());
}

absl::Status HierarchicalReducer::AgreeRound(const BroadcastWork& work) {
  // Each node's description of the round and its negation, maxed across
  // the nodes in one small allreduce: max == -max(-x) == min everywhere iff
  // every node runs the same round. The local ranks agreed already
  // (Job::ScanBroadcast); this catches nodes whose ranks issued different
  // sequences, which would otherwise mix unrelated data or hang in Gloo.
  constexpr int kFields = 4;
  const int64_t mine[kFields] = {
      static_cast<int64_t>(work.kind), static_cast<int64_t>(work.dtype),
      static_cast<int64_t>(work.op), static_cast<int64_t>(work.bytes)};
  int64_t v[2 * kFields];
  for (int i = 0; i < kFields; ++i) {
    v[i] = mine[i];
    v[kFields + i] = -mine[i];
  }
  RETURN_IF_ERROR(backend_->AllreduceWith(
      v, 2 * kFields, sizeof(int64_t),
      CombineFunction(CollectiveDType::kInt64, CollectiveOp::kMax)));
  static constexpr const char* kNames[kFields] = {"kind", "dtype", "op",
                                                  "bytes"};
  for (int i = 0; i < kFields; ++i) {
    const int64_t hi = v[i];
    const int64_t lo = -v[kFields + i];
    if (hi != lo) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the nodes disagree on collective round ", work.seq, ": node ",
          backend_->NodeName(backend_->node_rank()), " runs ",
          CollectiveKindName(static_cast<int32_t>(work.kind)), " (dtype ",
          CollectiveDTypeName(work.dtype), ", op ", CollectiveOpName(work.op),
          ", ", work.bytes, " bytes) but the nodes' ", kNames[i],
          " ranges over ", lo, "..", hi,
          "; every rank of the job must issue the same collectives"));
    }
  }
  return absl::OkStatus();
}

void HierarchicalReducer::RunAreaCollective(BroadcastItem& item) {
  const BroadcastWork& work = item.work;
  if (broken_.ok()) {
    const Clock::time_point start = Clock::now();
    absl::Status s = AgreeRound(work);
    if (s.ok()) {
      const AreaNetworkStep step =
          PrepareAreaCollective(work, &collective_scratch_);
      if (step.count > 0) {
        s = backend_->AllreduceWith(step.data, step.count, step.elem_bytes,
                                    step.combine);
      }
      if (s.ok()) FinishAreaCollective(work, step);
    }
    network_ns_.fetch_add(NanosSince(start), std::memory_order_relaxed);
    if (!s.ok()) broken_ = std::move(s);
  }
  // Large scratches (allgather of a big area) are not kept between rounds.
  if (collective_scratch_.capacity() > (size_t{1} << 20)) {
    std::vector<char>().swap(collective_scratch_);
  }
  std::move(item.done)(broken_);
}

}  // namespace gradd
