// HierarchicalReducer over FakeCollectiveBackend: several "nodes" as threads,
// each with its own local ranks' buffers. The fake fails any call whose kind
// or size differs between nodes, so out-of-plan-order network traffic shows
// up as an error, not as silently wrong sums.
#include "server/engine/reduce/hierarchical_reducer.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/reduce.h"
#include "common/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backends/fake_collective_backend.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

// Waits (bounded) for a number of completions and keeps their statuses.
class Completions {
 public:
  BucketReducerInterface::Completion Add() {
    absl::MutexLock lock(&mu_);
    ++expected_;
    return [this](absl::Status s) {
      absl::MutexLock lock(&mu_);
      statuses_.push_back(std::move(s));
    };
  }
  // All statuses once every Add()ed completion ran; a DEADLINE_EXCEEDED
  // entry if that takes over `limit`.
  std::vector<absl::Status> Wait(absl::Duration limit = absl::Seconds(20)) {
    absl::MutexLock lock(&mu_);
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(statuses_.size()) == expected_;
    };
    std::vector<absl::Status> out;
    if (!mu_.AwaitWithTimeout(absl::Condition(&all), limit)) {
      out.push_back(absl::DeadlineExceededError("test: completions missing"));
    }
    out.insert(out.end(), statuses_.begin(), statuses_.end());
    statuses_.clear();
    expected_ = 0;
    return out;
  }

 private:
  absl::Mutex mu_;
  int expected_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Status> statuses_ ABSL_GUARDED_BY(mu_);
};

// One node: its local ranks' buckets (float32 and float16 buckets of
// different sizes) and its reducer.
struct Node {
  int local_world = 0;
  int offset = 0;
  std::vector<DType> dtypes;
  std::vector<size_t> counts;
  // buffers[b][r] and the vectors' storage.
  std::vector<std::vector<void*>> buffers;
  std::vector<std::vector<std::vector<char>>> storage;
  std::vector<void*> areas;
  std::vector<std::vector<char>> area_storage;
  std::unique_ptr<HierarchicalReducer> reducer;
  // Owned by `reducer`.
  FakeCollectiveBackend* backend = nullptr;
};

constexpr size_t kCounts[] = {7, 300000, 64, 1000};
constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat32, DType::kFloat16,
                             DType::kFloat64};

// The value global rank g writes into element j of bucket b in iteration t:
// small multiples of 1/2 (exact in every dtype) whose rank terms cancel, so
// the average over `world` ranks is exactly Want(t, b, j).
double Want(uint64_t t, int b, size_t j) {
  return static_cast<double>(
             static_cast<int64_t>((3 * j + 7 * t + 13 * b) % 61) - 30) *
         0.5;
}
double Value(uint64_t t, int b, size_t j, int g, int world) {
  return Want(t, b, j) + (2.0 * g - (world - 1)) / 2;
}

void Put(void* buf, DType dtype, size_t j, double v) {
  switch (dtype) {
    case DType::kFloat32:
      static_cast<float*>(buf)[j] = static_cast<float>(v);
      break;
    case DType::kFloat64:
      static_cast<double*>(buf)[j] = v;
      break;
    case DType::kFloat16:
      static_cast<uint16_t*>(buf)[j] = FloatToHalf(static_cast<float>(v));
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(buf)[j] = FloatToBFloat16(static_cast<float>(v));
      break;
  }
}
double Get(const void* buf, DType dtype, size_t j) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(buf)[j];
    case DType::kFloat64:
      return static_cast<const double*>(buf)[j];
    case DType::kFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(buf)[j]);
    case DType::kBFloat16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(buf)[j]);
  }
  return 0;
}

class HierarchicalReducerTest : public ::testing::Test {
 protected:
  // Builds nodes with the given local world sizes over a fake group.
  void MakeNodes(const std::vector<int>& local_worlds,
                 absl::Duration timeout = absl::Seconds(10),
                 size_t chunk_bytes = HierarchicalReducer::kDefaultChunkBytes,
                 HierarchicalReducer::Options::LocalSum local_sum =
                     HierarchicalReducer::Options::LocalSum::kAuto,
                 std::vector<int> given_offsets = {}) {
    auto backends = FakeCollectiveBackend::CreateGroup(
        static_cast<int>(local_worlds.size()), timeout,
        {"alpha", "beta", "gamma", "delta"});
    backends.resize(local_worlds.size());
    std::vector<int> offsets;
    int world = 0;
    for (int lw : local_worlds) {
      offsets.push_back(world);
      world += lw;
    }
    // Global rank offsets as a re-formation may leave them (not rising
    // with node rank), else in node order.
    if (!given_offsets.empty()) offsets = std::move(given_offsets);
    world_ = world;
    nodes_.clear();
    nodes_.resize(local_worlds.size());
    for (size_t k = 0; k < local_worlds.size(); ++k) {
      Node& n = nodes_[k];
      n.local_world = local_worlds[k];
      n.offset = offsets[k];
      for (size_t b = 0; b < std::size(kCounts); ++b) {
        n.dtypes.push_back(kDTypes[b]);
        n.counts.push_back(kCounts[b]);
        n.storage.emplace_back();
        n.buffers.emplace_back();
        for (int r = 0; r < n.local_world; ++r) {
          n.storage[b].emplace_back(kCounts[b] * DTypeSize(kDTypes[b]));
        }
        for (int r = 0; r < n.local_world; ++r) {
          n.buffers[b].push_back(n.storage[b][r].data());
        }
      }
      for (int r = 0; r < n.local_world; ++r) {
        n.area_storage.emplace_back(kAreaBytes);
      }
      for (int r = 0; r < n.local_world; ++r) {
        n.areas.push_back(n.area_storage[r].data());
      }
      HierarchicalReducer::Options options;
      options.pool = &pool_;
      options.num_buckets = static_cast<int>(std::size(kCounts));
      options.node_offsets = offsets;
      options.world_size = world;
      options.chunk_bytes = chunk_bytes;
      options.local_sum = local_sum;
      options.scheduling = scheduling_;
      n.backend = backends[k].get();
      n.reducer = std::make_unique<HierarchicalReducer>(options,
                                                        std::move(backends[k]));
    }
  }

  // Node k's engine: `iterations` iterations, buckets started in a random
  // order each time, every value checked after each iteration.
  // `timings` (may be null): each bucket's phases in the last iteration.
  void RunNode(int k, int iterations, std::vector<std::string>* errors,
               std::vector<BucketTiming>* timings = nullptr) {
    Node& n = nodes_[k];
    std::vector<BucketTiming> local_timings(n.counts.size());
    std::mt19937 rng(1234 + k);
    std::vector<int> order(n.counts.size());
    for (size_t b = 0; b < order.size(); ++b) order[b] = static_cast<int>(b);
    Completions completions;
    for (uint64_t t = 1; t <= static_cast<uint64_t>(iterations); ++t) {
      for (size_t b = 0; b < n.counts.size(); ++b) {
        for (int r = 0; r < n.local_world; ++r) {
          for (size_t j = 0; j < n.counts[b]; ++j) {
            Put(n.buffers[b][r], n.dtypes[b], j,
                Value(t, static_cast<int>(b), j, n.offset + r, world_));
          }
        }
      }
      std::shuffle(order.begin(), order.end(), rng);
      for (int b : order) {
        BucketWork work;
        work.bucket = b;
        work.iteration = t;
        work.dtype = n.dtypes[b];
        work.count = n.counts[b];
        work.rank_buffers = &n.buffers[b];
        local_timings[b] = BucketTiming();
        work.timing = &local_timings[b];
        n.reducer->Start(work, completions.Add());
      }
      for (const absl::Status& s : completions.Wait()) {
        if (!s.ok()) {
          errors->push_back(s.ToString());
          return;
        }
      }
      for (size_t b = 0; b < n.counts.size(); ++b) {
        for (int r = 0; r < n.local_world; ++r) {
          for (size_t j = 0; j < n.counts[b]; ++j) {
            const double got = Get(n.buffers[b][r], n.dtypes[b], j);
            const double want = Want(t, static_cast<int>(b), j);
            if (got != want) {
              errors->push_back(absl::StrCat("node ", k, " iteration ", t,
                                             " bucket ", b, " rank ", r, "[", j,
                                             "]: ", got, " != ", want));
              return;
            }
          }
        }
      }
    }
    if (timings != nullptr) *timings = local_timings;
  }

  // RunNode on the first `count` nodes (all by default) at once, one
  // thread each; each node's errors.
  std::vector<std::vector<std::string>> RunAllNodes(int iterations,
                                                    int count = -1) {
    const size_t num = count < 0 ? nodes_.size() : static_cast<size_t>(count);
    std::vector<std::vector<std::string>> errors(num);
    std::vector<std::thread> threads;
    for (size_t k = 0; k < num; ++k) {
      threads.emplace_back([this, k, iterations, &errors] {
        RunNode(static_cast<int>(k), iterations, &errors[k]);
      });
    }
    for (auto& t : threads) t.join();
    return errors;
  }

  static constexpr size_t kAreaBytes = 4096;
  // Broadcasts from each root in turn over nodes_ and checks that every
  // rank of every node got the root's bytes.
  void CheckBroadcasts(const std::vector<int>& roots);
  ThreadPool pool_{2};
  HierarchicalReducer::Options::Scheduling scheduling_ =
      HierarchicalReducer::Options::Scheduling::kPlanOrder;
  int world_ = 0;
  std::vector<Node> nodes_;
};

TEST_F(HierarchicalReducerTest, AveragesAcrossNodesInPlanOrder) {
  MakeNodes({2, 1, 3});
  std::vector<std::vector<std::string>> errors = RunAllNodes(12);
  for (size_t k = 0; k < nodes_.size(); ++k) {
    EXPECT_TRUE(errors[k].empty()) << "node " << k << ": " << errors[k][0];
  }
  for (const Node& n : nodes_) {
    ReducerStats s = n.reducer->stats();
    EXPECT_EQ(s.buckets, 12 * std::size(kCounts));
    EXPECT_GT(s.local_reduce_ns, 0u);
    EXPECT_GT(s.network_ns, 0u);
    EXPECT_GT(s.write_back_ns, 0u);
  }
}

TEST_F(HierarchicalReducerTest, AveragesAcrossNodesInAgreedPriorityOrder) {
  // Every bucket's priority is 0 (ties: bucket index); whole, and in
  // 64 KiB partitions, with float16 and float64 buckets among them.
  scheduling_ = HierarchicalReducer::Options::Scheduling::kPriority;
  for (size_t chunk_bytes : {size_t{0}, size_t{64} << 10}) {
    MakeNodes({2, 1, 3}, absl::Seconds(10), chunk_bytes);
    std::vector<std::vector<std::string>> errors = RunAllNodes(12);
    for (size_t k = 0; k < nodes_.size(); ++k) {
      EXPECT_TRUE(errors[k].empty()) << "node " << k << ": " << errors[k][0];
      EXPECT_EQ(nodes_[k].reducer->stats().buckets, 12 * std::size(kCounts));
    }
  }
}

TEST_F(HierarchicalReducerTest, RecordsEachBucketsPhasesForTheEventStream) {
  MakeNodes({2, 2});
  std::vector<std::string> errors[2];
  std::vector<BucketTiming> timings[2];
  std::thread other([&] { RunNode(1, 2, &errors[1], &timings[1]); });
  RunNode(0, 2, &errors[0], &timings[0]);
  other.join();
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(errors[k].empty()) << errors[k][0];
    ASSERT_EQ(timings[k].size(), std::size(kCounts));
    for (size_t b = 0; b < std::size(kCounts); ++b) {
      const BucketTiming& t = timings[k][b];
      SCOPED_TRACE(absl::StrCat("node ", k, " bucket ", b));
      // Every bucket goes through the network.
      EXPECT_GT(t.network.start_ns, 0);
      EXPECT_GE(t.network.duration_ns, 0);
      if (kDTypes[b] == DType::kFloat16) {
        // The accumulator path: local sum, allreduce, write-back, in order.
        EXPECT_GT(t.local_reduce.start_ns, 0);
        EXPECT_GT(t.write_back.start_ns, 0);
        EXPECT_LE(t.local_reduce.start_ns, t.network.start_ns);
        EXPECT_LE(t.network.start_ns + t.network.duration_ns,
                  t.write_back.start_ns);
      } else {
        // Whole float32/float64 buckets: the backend folds the write-back
        // into its ring.
        EXPECT_EQ(t.write_back.start_ns, 0);
      }
    }
  }
}

TEST_F(HierarchicalReducerTest, LocalSumOnEitherThreadAveragesExactly) {
  using LocalSum = HierarchicalReducer::Options::LocalSum;
  for (LocalSum where : {LocalSum::kEngineThread, LocalSum::kNetwork}) {
    SCOPED_TRACE(where == LocalSum::kEngineThread ? "engine thread"
                                                  : "network schedule");
    MakeNodes({2, 1, 3}, absl::Seconds(10),
              HierarchicalReducer::kDefaultChunkBytes, where);
    constexpr int kIterations = 4;
    std::vector<std::vector<std::string>> errors = RunAllNodes(kIterations);
    // Three of the four buckets are float32/float64: averaged whole by the
    // backend; the float16 one takes the accumulator path.
    for (size_t k = 0; k < nodes_.size(); ++k) {
      ASSERT_TRUE(errors[k].empty()) << "node " << k << ": " << errors[k][0];
      const Node& n = nodes_[k];
      EXPECT_EQ(n.backend->average_calls(), 3 * kIterations);
      EXPECT_EQ(n.backend->allreduce_calls(), 4 * kIterations);
      const bool presummed =
          where == LocalSum::kEngineThread && n.local_world > 1;
      EXPECT_EQ(n.backend->presummed_average_calls(),
                presummed ? 3 * kIterations : 0)
          << "node " << k;
    }
  }
}

TEST_F(HierarchicalReducerTest, ChunkedBucketsAverageExactly) {
  // 64 KiB chunks: the 300000-element bucket goes to the network in 19
  // pieces, the float64 one (8000 bytes) in one; every node must split the
  // same way or the fake fails the mismatched calls.
  MakeNodes({1, 3}, absl::Seconds(10), 64 << 10);
  std::vector<std::vector<std::string>> errors = RunAllNodes(6);
  for (size_t k = 0; k < nodes_.size(); ++k) {
    EXPECT_TRUE(errors[k].empty()) << "node " << k << ": " << errors[k][0];
    EXPECT_EQ(nodes_[k].reducer->stats().buckets, 6 * std::size(kCounts));
  }
}

// Broadcasts from each root in turn over nodes_ and checks that every
// rank of every node got the root's bytes.
void HierarchicalReducerTest::CheckBroadcasts(const std::vector<int>& roots) {
  uint64_t seq = 0;
  for (int root : roots) {
    ++seq;
    std::vector<std::thread> threads;
    std::vector<absl::Status> results(nodes_.size());
    for (size_t k = 0; k < nodes_.size(); ++k) {
      Node& n = nodes_[k];
      for (int r = 0; r < n.local_world; ++r) {
        const int g = n.offset + r;
        for (size_t i = 0; i < kAreaBytes; ++i) {
          n.area_storage[r][i] =
              static_cast<char>(g == root ? i * 7 + root : 0x5a);
        }
      }
      threads.emplace_back([&, k] {
        Completions c;
        BroadcastWork work;
        work.seq = seq;
        work.root = root;
        work.bytes = kAreaBytes;
        work.rank_areas = &nodes_[k].areas;
        nodes_[k].reducer->StartBroadcast(work, c.Add());
        std::vector<absl::Status> s = c.Wait();
        results[k] = s.size() == 1 ? s[0] : absl::InternalError("lost");
      });
    }
    for (auto& t : threads) t.join();
    for (size_t k = 0; k < nodes_.size(); ++k) {
      ASSERT_TRUE(results[k].ok()) << "root " << root << ": " << results[k];
      for (int r = 0; r < nodes_[k].local_world; ++r) {
        for (size_t i = 0; i < kAreaBytes; ++i) {
          ASSERT_EQ(nodes_[k].area_storage[r][i],
                    static_cast<char>(i * 7 + root))
              << "root " << root << " node " << k << " local rank " << r;
        }
      }
    }
  }
}

TEST_F(HierarchicalReducerTest, BroadcastFromAnyGlobalRank) {
  MakeNodes({2, 1, 3});
  // Roots on every node, including a non-zero local rank of a later node.
  CheckBroadcasts({0, 1, 2, 5, 4});
}

TEST_F(HierarchicalReducerTest, BroadcastFindsTheRootWhateverTheOffsetOrder) {
  // As after node 0 was lost and admitted again: it comes last in node-rank
  // order with its old ranks (offsets 1, 3, 0). Every root is found on its
  // own node.
  MakeNodes({2, 1, 1}, absl::Seconds(10),
            HierarchicalReducer::kDefaultChunkBytes,
            HierarchicalReducer::Options::LocalSum::kAuto, {1, 3, 0});
  CheckBroadcasts({0, 1, 2, 3});
}

TEST_F(HierarchicalReducerTest, DeadPeerFailsEveryBucketNamingIt) {
  MakeNodes({2, 2, 1}, absl::Seconds(5));
  // Node "gamma" never takes part: it goes away before the first bucket.
  nodes_[2].reducer.reset();
  const absl::Time start = absl::Now();
  std::vector<std::vector<std::string>> errors = RunAllNodes(3, 2);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (int k = 0; k < 2; ++k) {
    ASSERT_EQ(errors[k].size(), 1u) << "node " << k;
    EXPECT_THAT(errors[k][0], HasSubstr("gamma"));
  }
  // Later buckets fail at once with the same error, never hang.
  Completions c;
  BucketWork work;
  work.bucket = 0;
  work.iteration = 1;
  work.dtype = nodes_[0].dtypes[0];
  work.count = nodes_[0].counts[0];
  work.rank_buffers = &nodes_[0].buffers[0];
  nodes_[0].reducer->Start(work, c.Add());
  std::vector<absl::Status> s = c.Wait(absl::Seconds(10));
  ASSERT_EQ(s.size(), 1u);
  EXPECT_THAT(s[0].ToString(), HasSubstr("gamma"));
}

TEST_F(HierarchicalReducerTest, DestroyingCancelsQueuedBuckets) {
  MakeNodes({1, 1});
  // Bucket 1 of iteration 1 waits for bucket 0, which never comes: the
  // destructor must complete it (CANCELLED) and return.
  Completions c;
  BucketWork work;
  work.bucket = 1;
  work.iteration = 1;
  work.dtype = nodes_[0].dtypes[1];
  work.count = nodes_[0].counts[1];
  work.rank_buffers = &nodes_[0].buffers[1];
  nodes_[0].reducer->Start(work, c.Add());
  nodes_[0].reducer.reset();
  std::vector<absl::Status> s = c.Wait(absl::Seconds(5));
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace gradd
