// The communication-hook stage (server/hooks/) with fakes: hooks run on
// several "nodes" as threads over FakeCollectiveBackend, which records what
// went on the wire; the hierarchical result is checked against the same
// hook on one node holding every rank.
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/bucket_planner.h"
#include "common/reduce.h"
#include "common/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backends/fake_collective_backend.h"
#include "server/engine/reduce/hierarchical_reducer.h"
#include "server/hooks/comm_hook_factory.h"
#include "server/hooks/compress_hook.h"
#include "server/hooks/powersgd_hook.h"
#include "server/rendezvous/fake_store.h"
#include "server/rendezvous/kv_store.h"

namespace gradd {
namespace {

using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Rank `global`'s gradient element i: distinct per rank, not exactly
// representable in 16 bits.
float Grad(int global, size_t i, uint64_t iteration = 1) {
  return std::sin(0.37f * static_cast<float>(i + 1) * (global + 1) +
                  0.11f * iteration) *
         (1.0f + 0.01f * global);
}

// Runs fn(node) on `nodes` threads at once.
void OnEachNode(int nodes, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int n = 0; n < nodes; ++n) threads.emplace_back(fn, n);
  for (std::thread& t : threads) t.join();
}

// Each local rank's bucket. Not copyable: ptrs point into data.
struct Buffers {
  std::vector<std::vector<float>> data;
  std::vector<void*> ptrs;
  Buffers(int ranks, size_t count) : data(ranks, std::vector<float>(count)) {
    for (auto& d : data) ptrs.push_back(d.data());
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
};

// n Buffers of `ranks` x `count`.
std::vector<std::unique_ptr<Buffers>> MakeBuffers(int n, int ranks,
                                                  size_t count) {
  std::vector<std::unique_ptr<Buffers>> out;
  for (int i = 0; i < n; ++i)
    out.push_back(std::make_unique<Buffers>(ranks, count));
  return out;
}

CommHookWork WorkOf(Buffers& b, int bucket, uint64_t iteration) {
  CommHookWork w;
  w.bucket = bucket;
  w.iteration = iteration;
  w.dtype = DType::kFloat32;
  w.count = b.data[0].size();
  w.rank_buffers = &b.ptrs;
  return w;
}

TEST(Compress16HookTest, PutsSixteenBitValuesOnTheWire) {
  constexpr int kNodes = 2, kLocal = 2, kWorld = kNodes * kLocal;
  constexpr size_t kCount = 1000;
  for (DType wire : {DType::kFloat16, DType::kBFloat16}) {
    auto backends = FakeCollectiveBackend::CreateGroup(kNodes);
    auto bufs = MakeBuffers(kNodes, kLocal, kCount);
    std::vector<absl::Status> status(kNodes);
    OnEachNode(kNodes, [&](int n) {
      for (int r = 0; r < kLocal; ++r) {
        for (size_t i = 0; i < kCount; ++i) {
          bufs[n]->data[r][i] = Grad(n * kLocal + r, i);
        }
      }
      Compress16Hook hook(wire, kWorld, nullptr);
      status[n] = hook.Run(WorkOf(*bufs[n], 0, 1), *backends[n]);
    });
    for (int n = 0; n < kNodes; ++n) {
      ASSERT_TRUE(status[n].ok()) << status[n];
      EXPECT_THAT(backends[n]->allreduce_dtypes(), ElementsAre(wire));
      EXPECT_EQ(backends[n]->allreduce_bytes(), kCount * 2);
      for (size_t i = 0; i < kCount; ++i) {
        // Each node: (its float32 sum / world) rounded to 16 bits; the wire
        // adds the two nodes' values and rounds again.
        auto round16 = [&](float f) {
          return wire == DType::kFloat16 ? HalfToFloat(FloatToHalf(f))
                                         : BFloat16ToFloat(FloatToBFloat16(f));
        };
        float want = 0;
        for (int k = 0; k < kNodes; ++k) {
          const float node_sum = Grad(k * kLocal, i) + Grad(k * kLocal + 1, i);
          want = round16(want + round16(node_sum / kWorld));
        }
        for (int r = 0; r < kLocal; ++r) {
          ASSERT_EQ(bufs[n]->data[r][i], want)
              << "node " << n << " rank " << r << " element " << i;
        }
      }
    }
  }
}

// Buckets of more than two chunks (1 Mi elements) are pipelined: one
// allreduce per chunk, in order, and exactly the values of the whole-bucket
// path; a peer that goes away fails the bucket instead of hanging it.
TEST(Compress16HookTest, LargeBucketsArePipelinedInChunksWithTheSameValues) {
  constexpr int kNodes = 2, kLocal = 2, kWorld = kNodes * kLocal;
  constexpr size_t kCount = 5 * (size_t{1} << 20) + 321;
  auto backends = FakeCollectiveBackend::CreateGroup(kNodes);
  auto bufs = MakeBuffers(kNodes, kLocal, kCount);
  std::vector<absl::Status> status(kNodes);
  ThreadPool pool(2);
  OnEachNode(kNodes, [&](int n) {
    for (int r = 0; r < kLocal; ++r) {
      for (size_t i = 0; i < kCount; ++i) {
        bufs[n]->data[r][i] = Grad(n * kLocal + r, i);
      }
    }
    Compress16Hook hook(DType::kBFloat16, kWorld, &pool);
    status[n] = hook.Run(WorkOf(*bufs[n], 0, 1), *backends[n]);
  });
  auto round16 = [](float f) { return BFloat16ToFloat(FloatToBFloat16(f)); };
  for (int n = 0; n < kNodes; ++n) {
    ASSERT_TRUE(status[n].ok()) << status[n];
    EXPECT_EQ(backends[n]->allreduce_calls(), 6);
    EXPECT_EQ(backends[n]->allreduce_bytes(), kCount * 2);
    for (size_t i = 0; i < kCount; i += 997) {
      float want = 0;
      for (int k = 0; k < kNodes; ++k) {
        const float node_sum = Grad(k * kLocal, i) + Grad(k * kLocal + 1, i);
        want = round16(want + round16(node_sum / kWorld));
      }
      for (int r = 0; r < kLocal; ++r) {
        ASSERT_EQ(bufs[n]->data[r][i], want) << "node " << n << " i " << i;
      }
    }
  }
}

TEST(Compress16HookTest, APeerLeavingMidPipelineFailsTheBucket) {
  constexpr size_t kCount = 5 * (size_t{1} << 20);
  auto backends = FakeCollectiveBackend::CreateGroup(2, absl::Seconds(10));
  auto bufs = MakeBuffers(1, 1, kCount);
  backends[1]->Leave();
  Compress16Hook hook(DType::kFloat16, 2, nullptr);
  absl::Status s = hook.Run(WorkOf(*bufs[0], 0, 1), *backends[0]);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

// The reducer hands hooked buckets to the hook on its network thread, in
// plan order: what goes on the wire is the hook's 16-bit buffer.
TEST(Compress16HookTest, HierarchicalReducerRunsTheHook) {
  constexpr int kNodes = 2, kLocal = 2, kWorld = kNodes * kLocal;
  constexpr size_t kCount = 513;
  auto backends = FakeCollectiveBackend::CreateGroup(kNodes);
  std::vector<FakeCollectiveBackend*> fakes;
  std::vector<std::unique_ptr<HierarchicalReducer>> reducers;
  for (int n = 0; n < kNodes; ++n) {
    HierarchicalReducer::Options options;
    options.num_buckets = 2;
    options.node_offsets = {0, kLocal};
    options.world_size = kWorld;
    fakes.push_back(backends[n].get());
    reducers.push_back(
        std::make_unique<HierarchicalReducer>(options, std::move(backends[n])));
    ASSERT_TRUE(reducers[n]
                    ->SetCommHook(std::make_unique<Compress16Hook>(
                        DType::kFloat16, kWorld, nullptr))
                    .ok());
  }
  std::vector<std::vector<std::unique_ptr<Buffers>>> bufs;
  for (int n = 0; n < kNodes; ++n)
    bufs.push_back(MakeBuffers(2, kLocal, kCount));
  absl::Mutex mu;
  int done = 0;
  std::vector<absl::Status> status;
  for (int n = 0; n < kNodes; ++n) {
    // Bucket 1 first: the reducer must still send bucket 0 first.
    for (int b : {1, 0}) {
      for (int r = 0; r < kLocal; ++r) {
        for (size_t i = 0; i < kCount; ++i) {
          bufs[n][b]->data[r][i] = Grad(n * kLocal + r, i + b);
        }
      }
      BucketWork work;
      work.bucket = b;
      work.iteration = 1;
      work.dtype = DType::kFloat32;
      work.count = kCount;
      work.rank_buffers = &bufs[n][b]->ptrs;
      reducers[n]->Start(work, [&](absl::Status s) {
        absl::MutexLock lock(&mu);
        status.push_back(std::move(s));
        ++done;
      });
    }
  }
  {
    absl::MutexLock lock(&mu);
    auto all = [&]() { return done == 2 * kNodes; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(20)));
  }
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
  for (FakeCollectiveBackend* f : fakes) {
    EXPECT_THAT(f->allreduce_dtypes(),
                ElementsAre(DType::kFloat16, DType::kFloat16));
    EXPECT_EQ(f->allreduce_bytes(), 2 * kCount * 2);
  }
  for (size_t i = 0; i < kCount; ++i) {
    float exact = 0;
    for (int g = 0; g < kWorld; ++g) exact += Grad(g, i);
    exact /= kWorld;
    EXPECT_NEAR(bufs[0][0]->data[1][i], exact, 2e-3f * (1 + std::fabs(exact)));
    EXPECT_EQ(bufs[0][0]->data[0][i], bufs[1][0]->data[1][i]);
  }
}

// Two nodes "node-a" and "node-b" whose reducers meet in `kv`; `adjust`
// changes node n's options.
std::vector<std::unique_ptr<HierarchicalReducer>> AgreeingNodes(
    KvStore* kv,
    const std::function<void(int, HierarchicalReducer::Options&)>& adjust) {
  auto backends = FakeCollectiveBackend::CreateGroup(2, absl::Seconds(10),
                                                     {"node-a", "node-b"});
  std::vector<std::unique_ptr<HierarchicalReducer>> reducers;
  for (int n = 0; n < 2; ++n) {
    HierarchicalReducer::Options options;
    options.num_buckets = 1;
    options.node_offsets = {0, 1};
    options.world_size = 2;
    options.job_id = "job";
    options.store_prefix = "round0";
    options.agree_timeout = absl::Seconds(10);
    adjust(n, options);
    reducers.push_back(std::make_unique<HierarchicalReducer>(
        options, std::move(backends[n]),
        std::make_unique<FakeRendezvousStore>(
            FakeRendezvousStore::Options{.inner = kv})));
  }
  return reducers;
}

// Nodes compare their hooks through the store and name each other.
TEST(HierarchicalReducerCommHookTest, NodesMustAgreeOnTheHook) {
  for (bool same : {true, false}) {
    KvStore kv;
    std::vector<std::unique_ptr<HierarchicalReducer>> reducers =
        AgreeingNodes(&kv, [](int, HierarchicalReducer::Options&) {});
    std::vector<absl::Status> status(2);
    OnEachNode(2, [&](int n) {
      status[n] = reducers[n]->AgreeCommHook(n == 1 && !same ? "bf16_compress"
                                                             : "fp16_compress");
    });
    for (int n = 0; n < 2; ++n) {
      if (same) {
        EXPECT_TRUE(status[n].ok()) << status[n];
        continue;
      }
      EXPECT_EQ(status[n].code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(status[n].message(), HasSubstr("node-a"));
      EXPECT_THAT(status[n].message(), HasSubstr("node-b"));
      EXPECT_THAT(status[n].message(), HasSubstr("bf16_compress"));
    }
  }
}

// The network schedule (scheduling, partition) is compared the same way,
// before the hook: a node configured differently fails the job, named.
TEST(HierarchicalReducerCommHookTest, NodesMustAgreeOnTheSchedule) {
  using Scheduling = HierarchicalReducer::Options::Scheduling;
  struct Case {
    Scheduling scheduling_b;
    size_t chunk_bytes_b;
    const char* want;
  };
  for (const Case& c :
       {Case{Scheduling::kPriority, 4 << 20, ""},
        Case{Scheduling::kPlanOrder, 4 << 20, "scheduling: none"},
        Case{Scheduling::kPriority, 1 << 20, "partition_mb: 1"}}) {
    KvStore kv;
    std::vector<std::unique_ptr<HierarchicalReducer>> reducers =
        AgreeingNodes(&kv, [&](int n, HierarchicalReducer::Options& options) {
          options.scheduling = n == 0 ? Scheduling::kPriority : c.scheduling_b;
          options.chunk_bytes = n == 0 ? 4 << 20 : c.chunk_bytes_b;
        });
    std::vector<absl::Status> status(2);
    OnEachNode(2,
               [&](int n) { status[n] = reducers[n]->AgreeCommHook("none"); });
    for (int n = 0; n < 2; ++n) {
      if (std::string(c.want).empty()) {
        EXPECT_TRUE(status[n].ok()) << status[n];
        continue;
      }
      EXPECT_EQ(status[n].code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(status[n].message(), HasSubstr("network schedule"));
      EXPECT_THAT(status[n].message(), HasSubstr("node-a"));
      EXPECT_THAT(status[n].message(), HasSubstr("node-b"));
      EXPECT_THAT(status[n].message(),
                  HasSubstr("scheduling: priority, partition_mb: 4"));
      EXPECT_THAT(status[n].message(), HasSubstr(c.want));
    }
  }
}

// A small model: a vector (never compressed), two same-shaped matrices and
// one of another shape, in one bucket.
struct Model {
  std::vector<ParamInfo> params = {{"w1", {24, 12}, DType::kFloat32},
                                   {"b1", {24}, DType::kFloat32},
                                   {"w2", {16, 20}, DType::kFloat32},
                                   {"w3", {24, 12}, DType::kFloat32}};
  BucketPlan plan;
  Model() {
    Bucket b;
    b.dtype = DType::kFloat32;
    size_t off = 0;
    for (int i = 0; i < static_cast<int>(params.size()); ++i) {
      b.params.push_back(i);
      b.param_offsets.push_back(off);
      off += params[i].bytes();
    }
    b.size_bytes = off;
    plan.buckets.push_back(b);
    plan.total_bytes = off;
  }
  size_t count() const { return plan.total_bytes / 4; }
};

TEST(PowerSgdHookTest, LayoutFollowsTorch) {
  Model m;
  const auto layouts =
      PowerSgdHook::PerParameterLayouts(m.params, m.plan, 2, 2.0);
  ASSERT_EQ(layouts.size(), 1u);
  const PowerSgdHook::Layout& l = layouts[0];
  // The vector is allreduced as it is.
  ASSERT_EQ(l.uncompressed.size(), 1u);
  EXPECT_EQ(l.uncompressed[0].first, 288u);
  EXPECT_EQ(l.uncompressed[0].second, 24u);
  // Grouped by shape in order of first appearance: w1, w3, then w2.
  ASSERT_EQ(l.matrices.size(), 3u);
  EXPECT_EQ(l.matrices[0].offset, 0u);
  EXPECT_EQ(l.matrices[1].offset, 632u);
  EXPECT_EQ(l.matrices[2].offset, 312u);
  EXPECT_EQ(l.matrices[1].q_offset, 12u * 2u);
  EXPECT_EQ(l.q_size, (12u + 12u + 20u) * 2u);
  EXPECT_EQ(l.p_size, (24u + 24u + 16u) * 2u);
  // Not worth it where (rows + cols) * rank * rate >= rows * cols.
  const auto rank8 =
      PowerSgdHook::PerParameterLayouts(m.params, m.plan, 8, 2.0);
  EXPECT_EQ(rank8[0].matrices.size(), 0u);
  const auto batched = PowerSgdHook::BatchedLayouts(m.plan, 1);
  EXPECT_EQ(batched[0].padded, 31u * 31u);  // ceil(sqrt(920)) = 31
}

v1::CommHookSpec PowerSgdSpec(const char* name, bool error_feedback,
                              bool warm_start) {
  v1::CommHookSpec spec;
  spec.set_name(name);
  spec.set_matrix_approximation_rank(2);
  spec.set_start_powersgd_iter(2);
  spec.set_use_error_feedback(error_feedback);
  spec.set_warm_start(warm_start);
  spec.set_random_seed(5);
  return NormalizeCommHookSpec(spec);
}

// P and Q are linear in the gradients: 2 nodes x 2 ranks (node sums, then
// the network) give what one node with all 4 ranks gives.
TEST(PowerSgdHookTest, TwoNodesMatchOneNodeWithEveryRank) {
  constexpr int kNodes = 2, kLocal = 2, kWorld = kNodes * kLocal;
  constexpr int kIterations = 4;  // 1-2 vanilla, 3-4 compressed
  for (const char* name : {"powerSGD", "batched_powerSGD"}) {
    for (bool error_feedback : {true, false}) {
      Model m;
      CommHookContext context;
      context.world_size = kWorld;
      context.params = &m.params;
      context.plan = &m.plan;
      const v1::CommHookSpec spec =
          PowerSgdSpec(name, error_feedback, /*warm_start=*/!error_feedback);
      auto flat_hook = MakeCommHook(spec, context);
      ASSERT_TRUE(flat_hook.ok()) << flat_hook.status();
      SingleNodeBackend one_node;
      Buffers flat(kWorld, m.count());

      auto backends = FakeCollectiveBackend::CreateGroup(kNodes);
      std::vector<std::unique_ptr<CommHookInterface>> hooks;
      for (int n = 0; n < kNodes; ++n) {
        auto h = MakeCommHook(spec, context);
        ASSERT_TRUE(h.ok());
        hooks.push_back(*std::move(h));
      }
      auto bufs = MakeBuffers(kNodes, kLocal, m.count());
      for (uint64_t it = 1; it <= kIterations; ++it) {
        for (int g = 0; g < kWorld; ++g) {
          for (size_t i = 0; i < m.count(); ++i) {
            flat.data[g][i] = Grad(g, i, it);
            bufs[g / kLocal]->data[g % kLocal][i] = Grad(g, i, it);
          }
        }
        ASSERT_TRUE((*flat_hook)->Run(WorkOf(flat, 0, it), one_node).ok());
        std::vector<absl::Status> status(kNodes);
        OnEachNode(kNodes, [&](int n) {
          status[n] = hooks[n]->Run(WorkOf(*bufs[n], 0, it), *backends[n]);
        });
        for (int n = 0; n < kNodes; ++n)
          ASSERT_TRUE(status[n].ok()) << status[n];
        for (int g = 0; g < kWorld; ++g) {
          for (size_t i = 0; i < m.count(); ++i) {
            ASSERT_NEAR(bufs[g / kLocal]->data[g % kLocal][i], flat.data[g][i],
                        1e-5)
                << name << " iteration " << it << " rank " << g << " element "
                << i;
          }
        }
        if (it <= 2) {
          // Vanilla: the plain average.
          for (size_t i = 0; i < m.count(); ++i) {
            float want = 0;
            for (int g = 0; g < kWorld; ++g) want += Grad(g, i, it);
            ASSERT_NEAR(flat.data[0][i], want / kWorld, 1e-6);
          }
        }
      }
      // Compressed iterations sent the uncompressed part, P and Q (float32).
      EXPECT_THAT(backends[0]->allreduce_dtypes(), Each(DType::kFloat32));
    }
  }
}

// Large products are split across the reduce pool: same values.
TEST(PowerSgdHookTest, PoolSplitGivesTheSameResult) {
  std::vector<ParamInfo> params = {{"w", {701, 400}, DType::kFloat32}};
  BucketPlan plan;
  Bucket b;
  b.dtype = DType::kFloat32;
  b.params = {0};
  b.param_offsets = {0};
  b.size_bytes = params[0].bytes();
  plan.buckets.push_back(b);
  plan.total_bytes = b.size_bytes;
  ThreadPool pool(2);
  std::vector<std::vector<float>> results;
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    CommHookContext context;
    context.world_size = 2;
    context.params = &params;
    context.plan = &plan;
    context.pool = p;
    auto hook = MakeCommHook(PowerSgdSpec("powerSGD", true, true), context);
    ASSERT_TRUE(hook.ok()) << hook.status();
    Buffers bufs(2, params[0].numel());
    SingleNodeBackend one_node;
    for (uint64_t it = 1; it <= 3; ++it) {
      for (int r = 0; r < 2; ++r) {
        for (size_t i = 0; i < params[0].numel(); ++i) {
          bufs.data[r][i] = Grad(r, i, it);
        }
      }
      ASSERT_TRUE((*hook)->Run(WorkOf(bufs, 0, it), one_node).ok());
    }
    results.push_back(bufs.data[0]);
  }
  EXPECT_EQ(results[0], results[1]);
}

TEST(PowerSgdHookTest, RefusesNonFloat32Buckets) {
  Model m;
  m.plan.buckets[0].dtype = DType::kFloat64;
  CommHookContext context;
  context.params = &m.params;
  context.plan = &m.plan;
  auto hook = MakeCommHook(PowerSgdSpec("powerSGD", true, true), context);
  EXPECT_EQ(hook.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(hook.status().message(), HasSubstr("float64"));
}

v1::CommHookSpec Named(const char* name) {
  v1::CommHookSpec spec;
  spec.set_name(name);
  return spec;
}

TEST(CommHookSelectionTest, UnknownHookNamesTheSupportedOnes) {
  CommHookSelection sel("job", 2, Named(""));
  absl::Status s = sel.Set(0, Named("quantize_per_tensor"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("quantize_per_tensor"));
  EXPECT_THAT(s.message(), HasSubstr("fp16_compress"));
  EXPECT_THAT(s.message(), HasSubstr("batched_powerSGD"));
}

TEST(CommHookSelectionTest, RanksMustAgree) {
  CommHookSelection sel("job", 3, Named(""));
  ASSERT_TRUE(sel.Set(0, Named("fp16_compress")).ok());
  absl::Status s = sel.Set(2, Named("bf16_compress"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("local ranks 0 and 2"));
  ASSERT_TRUE(sel.Set(1, Named("fp16_compress")).ok());
  // Rank 2 never chose: it keeps the job's hook, which differs.
  auto resolved = sel.Resolve();
  EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(resolved.status().message(), HasSubstr("local ranks 0 and 2"));
}

TEST(CommHookSelectionTest, OnceAndBeforeTheFirstBucket) {
  CommHookSelection sel("job", 1, Named("allreduce"));
  ASSERT_TRUE(sel.Set(0, Named("fp16_compress")).ok());
  absl::Status twice = sel.Set(0, Named("fp16_compress"));
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(twice.message(), HasSubstr("only be called once"));
  auto resolved = sel.Resolve();
  ASSERT_TRUE(resolved.ok());
  EXPECT_EQ(resolved->name(), "fp16_compress");
  CommHookSelection late("job", 1, Named(""));
  ASSERT_TRUE(late.Resolve().ok());
  absl::Status after = late.Set(0, Named("fp16_compress"));
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(after.message(), HasSubstr("before the first backward"));
}

TEST(CommHookSelectionTest, DefaultsMeanTheSameHook) {
  // Unset PowerSGD fields are torch's defaults, so they equal explicit ones.
  CommHookSelection sel("job", 2, Named(""));
  v1::CommHookSpec a = Named("powerSGD");
  v1::CommHookSpec b = Named("powerSGD");
  b.set_matrix_approximation_rank(1);
  b.set_start_powersgd_iter(1000);
  b.set_use_error_feedback(true);
  ASSERT_TRUE(sel.Set(0, a).ok());
  EXPECT_TRUE(sel.Set(1, b).ok());
  v1::CommHookSpec bad = Named("powerSGD");
  bad.set_start_powersgd_iter(1);
  EXPECT_EQ(ValidateCommHookSpec(bad, "x").code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradd
