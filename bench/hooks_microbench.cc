// gradd-hooks-microbench: the daemon's communication hooks on one node
// (SingleNodeBackend: the network is the identity), timed with Google
// Benchmark. What it measures is the hooks' own compute -- what the wire
// time of bench/netbench cannot show apart. Not a test; prints numbers.
//
//   build/bench/gradd-hooks-microbench [--benchmark_filter=PowerSgd]
//
// Buckets: 25 MiB of float32 (torch's default bucket size) from 2 local
// ranks, for PowerSGD viewed as one [1600, 4096] matrix (a Linear weight's
// shape; rank 4), the layout scripts/netbench registers.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "common/thread_pool.h"
#include "gradd/v1/comm_hook.pb.h"
#include "server/hooks/comm_hook.h"
#include "server/hooks/compress_hook.h"
#include "server/hooks/powersgd_hook.h"

namespace gradd {
namespace {

constexpr size_t kRows = 1600;
constexpr size_t kCols = 4096;
constexpr size_t kCount = kRows * kCols;
constexpr int kRanks = 2;

struct Buckets {
  std::vector<std::vector<float>> data;
  std::vector<void*> pointers;
  Buckets() : data(kRanks, std::vector<float>(kCount)) {
    std::mt19937 gen(1);
    std::normal_distribution<float> dist;
    for (auto& d : data) {
      for (float& v : d) v = dist(gen);
      pointers.push_back(d.data());
    }
  }
};

std::unique_ptr<ThreadPool> MaybePool(int threads) {
  return threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
}

void BM_PowerSgd(benchmark::State& state) {
  std::unique_ptr<ThreadPool> pool = MaybePool(state.range(0));
  v1::CommHookSpec spec;
  spec.set_name("powerSGD");
  spec.set_matrix_approximation_rank(4);
  spec.set_start_powersgd_iter(1);
  spec.set_use_error_feedback(true);
  spec.set_warm_start(true);
  PowerSgdHook::Layout layout;
  layout.count = kCount;
  layout.padded = kCount;
  PowerSgdHook::Matrix m;
  m.rows = kRows;
  m.cols = kCols;
  m.rank = 4;
  layout.matrices.push_back(m);
  layout.p_size = kRows * 4;
  layout.q_size = kCols * 4;
  PowerSgdHook hook(spec, kRanks, {layout}, pool.get());
  Buckets buckets;
  SingleNodeBackend net;
  CommHookWork work;
  work.count = kCount;
  work.rank_buffers = &buckets.pointers;
  uint64_t iteration = 2;  // past start_powersgd_iter: compressed
  for (auto _ : state) {
    work.iteration = iteration++;
    if (!hook.Run(work, net).ok()) state.SkipWithError("hook failed");
  }
  state.SetBytesProcessed(state.iterations() * kCount * sizeof(float));
  // Where the time went (PowerSgdHook::PhaseTimes), ms per run.
  const PowerSgdHook::PhaseTimes& t = hook.phase_times();
  const double runs = std::max<double>(1, t.runs);
  state.counters["q_ms"] = t.q_s * 1e3 / runs;
  state.counters["pass1_ms"] = t.pass1_s * 1e3 / runs;
  state.counters["orth_p_ms"] = t.orthogonalize_p_s * 1e3 / runs;
  state.counters["pass2_ms"] = t.pass2_s * 1e3 / runs;
  state.counters["pass3_ms"] = t.pass3_s * 1e3 / runs;
}
BENCHMARK(BM_PowerSgd)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

void BM_Compress16(benchmark::State& state) {
  std::unique_ptr<ThreadPool> pool = MaybePool(state.range(0));
  Compress16Hook hook(DType::kBFloat16, kRanks, pool.get());
  Buckets buckets;
  SingleNodeBackend net;
  CommHookWork work;
  work.count = kCount;
  work.rank_buffers = &buckets.pointers;
  for (auto _ : state) {
    ++work.iteration;
    if (!hook.Run(work, net).ok()) state.SkipWithError("hook failed");
  }
  state.SetBytesProcessed(state.iterations() * kCount * sizeof(float));
}
BENCHMARK(BM_Compress16)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace gradd

BENCHMARK_MAIN();
