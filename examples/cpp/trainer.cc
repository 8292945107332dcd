// A synthetic data-parallel trainer on gradd (used by scripts/demo and the
// integration tests).
//
// Registers a model of about --params float32 parameters in tensors of
// varied sizes (so the daemon plans several buckets), then for each
// iteration writes every gradient straight into gradd's shared bucket
// memory in reverse registration order -- as backward would -- marking each
// tensor ready as soon as it is written, and waits for the averages.
//
// --mode check (the default) checks every averaged value:
// gradient of element j of tensor p on rank r in iteration t (L ranks):
//   g = c(t, p, j) + (2r - (L - 1)) / 2,  c = (((j + 7t + 13p) mod 64) - 32) /
//   2
// The rank terms sum to zero, every partial sum is a small multiple of 1/2
// (exact in float32), so the average is exactly c whatever the order of
// summation: any difference is a real error, not rounding.
//
// --mode train keeps parameters w and takes --iterations SGD steps
// w -= lr * average(g), with g = w / 2 + c(step, p, j) + rank term: the data
// depends only on (rank, step), so a run is deterministic, and the restart-
// safe loop below makes a run in which a trainer is killed and started
// again end with the same parameters as an uninterrupted one:
//   - before each step, the state sync (Client::StateSyncPending ->
//     BeginStateSync -> Broadcast of the parameters and the step counter
//     from the root): a restarted trainer resumes from the synced step;
//   - an aborted iteration (IsIterationAborted) skips the update and
//     retries the same step with the same batch.
// It prints "SYNCED step=S root=R checksum=H t_ns=T" after each sync and
// "FINAL ... steps=N checksum=H" at the end (H: FNV-1a of the parameters'
// bytes), which tests compare.
//
//   gradd_example_trainer --socket /tmp/gradd.sock --local-rank 0
//       --local-world-size 2 [--job demo] [--iterations 50] [--params 10000000]
//       [--mode check|train] [--rank-restart-grace-ms MS] [--lr 0.125]
//       [--pause-at-step S]   (train: stop in the middle of step S's
//                              backward, print PAUSED, sleep; for tests)
//       [--step-sleep-ms MS]  (train: MS of "compute" in the middle of each
//                              step's backward; soak tests)
//       [--print-steps]       (train: "STEP s t_ns=T" after each applied
//                              step, T on CLOCK_MONOTONIC; recovery bench)
//       [--min-nodes N]       (node loss and arrival: the fewest nodes the
//                              multi-node job goes on with; train mode
//                              handles a lost or returning node like a
//                              restart: abort, state sync, retry)
//       [--divide-by-initial-world-size 0|1]
// Multi-node: the node settings come from the environment (GRADD_NUM_NODES,
// GRADD_NODE_RANK, GRADD_NODE_ID, GRADD_COORDINATOR; ClientOptions).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "gradd/client.h"

namespace {

struct Flags {
  std::string socket;
  std::string job = "demo";
  int local_rank = 0;
  int local_world_size = 1;
  int iterations = 50;
  int64_t params = 10'000'000;
  std::string mode = "check";
  std::optional<uint32_t> grace_ms;
  std::optional<uint32_t> min_nodes;
  bool divide_by_initial_world_size = false;
  float lr = 0.125f;
  int pause_at_step = -1;
  int step_sleep_ms = 0;
  bool print_steps = false;
};

void Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--socket PATH] [--job ID] --local-rank R "
               "--local-world-size L [--iterations N] [--params P] "
               "[--mode check|train] [--rank-restart-grace-ms MS] [--lr LR] "
               "[--pause-at-step S] [--step-sleep-ms MS] [--print-steps] "
               "[--min-nodes N] [--divide-by-initial-world-size 0|1]\n",
               argv0);
}

// Accepts --name=value and --name value.
bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--print-steps") {  // the one flag without a value
      flags->print_steps = true;
      continue;
    }
    std::string value;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      std::fprintf(stderr, "flag %s needs a value\n", arg.c_str());
      return false;
    }
    bool ok = true;
    if (arg == "--socket") {
      flags->socket = value;
    } else if (arg == "--job") {
      flags->job = value;
    } else if (arg == "--local-rank") {
      ok = absl::SimpleAtoi(value, &flags->local_rank);
    } else if (arg == "--local-world-size") {
      ok = absl::SimpleAtoi(value, &flags->local_world_size);
    } else if (arg == "--iterations") {
      ok = absl::SimpleAtoi(value, &flags->iterations);
    } else if (arg == "--params") {
      ok = absl::SimpleAtoi(value, &flags->params) && flags->params >= 1000;
    } else if (arg == "--mode") {
      flags->mode = value;
      ok = value == "check" || value == "train";
    } else if (arg == "--rank-restart-grace-ms") {
      uint32_t ms = 0;
      ok = absl::SimpleAtoi(value, &ms);
      flags->grace_ms = ms;
    } else if (arg == "--min-nodes") {
      uint32_t n = 0;
      ok = absl::SimpleAtoi(value, &n);
      flags->min_nodes = n;
    } else if (arg == "--divide-by-initial-world-size") {
      ok = value == "0" || value == "1";
      flags->divide_by_initial_world_size = value == "1";
    } else if (arg == "--lr") {
      ok = absl::SimpleAtof(value, &flags->lr);
    } else if (arg == "--pause-at-step") {
      ok = absl::SimpleAtoi(value, &flags->pause_at_step);
    } else if (arg == "--step-sleep-ms") {
      ok = absl::SimpleAtoi(value, &flags->step_sleep_ms) &&
           flags->step_sleep_ms >= 0;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", arg.c_str());
      return false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad value '%s' for %s\n", value.c_str(),
                   arg.c_str());
      return false;
    }
  }
  return true;
}

// A transformer-like mix: an embedding, blocks of large weight matrices
// with small biases and norms, and a head taking the rest of the budget.
std::vector<gradd::ClientParam> MakeModel(int64_t total) {
  std::vector<gradd::ClientParam> model;
  constexpr int64_t kWidth = 512;
  constexpr int kBlocks = 6;
  auto add = [&model](std::string name, std::vector<int64_t> shape) {
    model.push_back(
        {std::move(name), std::move(shape), gradd::dtype::kFloat32});
  };
  auto rows = [](int64_t n) { return std::max<int64_t>(1, n / kWidth); };
  int64_t used = 0;
  const int64_t embed_rows = rows(total / 6);
  add("embed.weight", {embed_rows, kWidth});
  used += embed_rows * kWidth;
  for (int b = 0; b < kBlocks; ++b) {
    const std::string p = absl::StrFormat("block%d.", b);
    // Alternate a larger and a smaller matrix so bucket sizes vary.
    const int64_t r1 = rows(total / 12), r2 = rows(total / 36);
    add(p + "attn.weight", {r1, kWidth});
    add(p + "attn.bias", {r1});
    add(p + "mlp.weight", {r2, kWidth});
    add(p + "mlp.bias", {r2});
    add(p + "norm.weight", {kWidth});
    used += (r1 + r2) * kWidth + r1 + r2 + kWidth;
  }
  const int64_t rest = std::max<int64_t>(kWidth, total - used);
  add("head.weight", {rest});
  return model;
}

inline float Expected(uint64_t t, int p, size_t j) {
  return static_cast<float>(
             static_cast<int>((j + 7 * t + 13 * static_cast<uint64_t>(p)) &
                              63) -
             32) *
         0.5f;
}

// CLOCK_MONOTONIC in nanoseconds (steady_clock on Linux), as printed in
// the STEP / SYNCED / ABORTED lines.
unsigned long long NowNs() {
  return static_cast<unsigned long long>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// FNV-1a over the parameters' bytes: equal checksums, equal parameters.
uint64_t Checksum(const std::vector<float>& w) {
  uint64_t h = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(w.data());
  for (size_t k = 0; k < w.size() * sizeof(float); ++k) {
    h = (h ^ bytes[k]) * 1099511628211ull;
  }
  return h;
}

// The restart-safe training loop (--mode train, see the top of the file).
// Returns the process's exit code: 0, 1 (the job failed).
int Train(const Flags& flags, gradd::Client& client) {
  const int rank = client.global_rank();
  const int world = client.world_size();
  const float rank_term = static_cast<float>(2 * rank - (world - 1)) * 0.5f;
  // Every tensor's parameters, one after the other; the same start on every
  // rank (a restarted trainer starts there too, then receives the job's).
  std::vector<size_t> offset(client.num_params() + 1, 0);
  for (int p = 0; p < client.num_params(); ++p) {
    offset[p + 1] = offset[p] + client.gradient_bytes(p) / sizeof(float);
  }
  std::vector<float> w(offset.back());
  for (size_t k = 0; k < w.size(); ++k) {
    w[k] = static_cast<float>(static_cast<int>(k % 17) - 8) * 0.25f;
  }
  uint64_t step = 0;  // updates applied so far: the job's state with w
  auto fail = [rank](const char* what, const absl::Status& s) {
    std::fprintf(stderr, "rank %d: ERROR %s: %s\n", rank, what,
                 s.ToString().c_str());
    return 1;
  };
  std::printf(
      "rank %d/%d: training %d steps (grace %u ms, rejoined %d) t_ns=%llu\n",
      rank, world, flags.iterations, client.rank_restart_grace_ms(),
      client.restarted() ? 1 : 0, NowNs());
  std::fflush(stdout);
  while (step < static_cast<uint64_t>(flags.iterations)) {
    // The state sync, before anything else of this step. Another restart
    // may abort it: then it is simply due again.
    if (client.StateSyncPending()) {
      absl::StatusOr<int> root = client.BeginStateSync();
      absl::Status s = root.status();
      if (s.ok())
        s = client.Broadcast(w.data(), w.size() * sizeof(float), *root);
      if (s.ok()) s = client.Broadcast(&step, sizeof(step), *root);
      if (gradd::IsIterationAborted(s)) continue;
      if (!s.ok()) return fail("state sync", s);
      std::printf(
          "rank %d: SYNCED step=%llu root=%d iteration=%llu live=%d "
          "epoch=%llu checksum=%016llx t_ns=%llu\n",
          rank, static_cast<unsigned long long>(step), *root,
          static_cast<unsigned long long>(client.iteration()),
          client.live_world_size(),
          static_cast<unsigned long long>(client.epoch()),
          // The checksum reads every parameter byte (~30 ms for 25 MiB):
          // the recovery bench (--print-steps) leaves it out.
          flags.print_steps ? 0ull
                            : static_cast<unsigned long long>(Checksum(w)),
          NowNs());
      std::fflush(stdout);
      if (step >= static_cast<uint64_t>(flags.iterations)) break;
    }
    // Backward: last layers first, each tensor handed over when written.
    for (int p = client.num_params() - 1; p >= 0; --p) {
      if (static_cast<int64_t>(step) == flags.pause_at_step &&
          p == client.num_params() / 2) {
        std::printf("rank %d: PAUSED step=%llu iteration=%llu\n", rank,
                    static_cast<unsigned long long>(step),
                    static_cast<unsigned long long>(client.iteration()));
        std::fflush(stdout);
        std::this_thread::sleep_for(std::chrono::hours(1));
      }
      if (flags.step_sleep_ms > 0 && p == client.num_params() / 2) {
        std::this_thread::sleep_for(
            std::chrono::milliseconds(flags.step_sleep_ms));
      }
      float* g = static_cast<float*>(client.gradient(p));
      const float* wp = w.data() + offset[p];
      const size_t n = offset[p + 1] - offset[p];
      for (size_t j = 0; j < n; ++j) {
        g[j] = 0.5f * wp[j] + Expected(step, p, j) + rank_term;
      }
      if (auto s = client.MarkReady(p); !s.ok()) return fail("MarkReady", s);
    }
    const uint64_t it = client.iteration();
    if (absl::Status s = client.WaitAll(); gradd::IsIterationAborted(s)) {
      // No update: the same step (the same batch) runs again.
      std::printf("rank %d: ABORTED step=%llu iteration=%llu t_ns=%llu: %s\n",
                  rank, static_cast<unsigned long long>(step),
                  static_cast<unsigned long long>(it), NowNs(),
                  std::string(s.message()).c_str());
      std::fflush(stdout);
      continue;
    } else if (!s.ok()) {
      return fail("WaitAll", s);
    }
    // The optimizer step on the averages.
    for (int p = 0; p < client.num_params(); ++p) {
      const float* g = static_cast<const float*>(client.gradient(p));
      float* wp = w.data() + offset[p];
      const size_t n = offset[p + 1] - offset[p];
      for (size_t j = 0; j < n; ++j) wp[j] -= flags.lr * g[j];
    }
    ++step;
    if (flags.print_steps) {
      std::printf("rank %d: STEP %llu t_ns=%llu\n", rank,
                  static_cast<unsigned long long>(step), NowNs());
      std::fflush(stdout);
    }
  }
  std::printf(
      "rank %d/%d: FINAL rejoined=%d aborted=%llu restarts=%llu live=%d "
      "epoch=%llu min_nodes=%u steps=%llu checksum=%016llx w0=%.9g\n",
      rank, world, client.restarted() ? 1 : 0,
      static_cast<unsigned long long>(client.iterations_aborted()),
      static_cast<unsigned long long>(client.restarts()),
      client.live_world_size(), static_cast<unsigned long long>(client.epoch()),
      client.min_nodes(), static_cast<unsigned long long>(step),
      static_cast<unsigned long long>(Checksum(w)), w[0]);
  std::fflush(stdout);
  if (auto s = client.Detach(); !s.ok()) return fail("detach", s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    Usage(argv[0]);
    return 2;
  }
  const std::vector<gradd::ClientParam> model = MakeModel(flags.params);
  int64_t numel = 0;
  for (const auto& p : model) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    numel += n;
  }

  gradd::ClientOptions options;
  options.socket_path = flags.socket;
  options.job_id = flags.job;
  options.local_rank = flags.local_rank;
  options.local_world_size = flags.local_world_size;
  options.rank_restart_grace_ms = flags.grace_ms;
  options.min_nodes = flags.min_nodes;
  options.divide_by_initial_world_size = flags.divide_by_initial_world_size;
  auto attached = gradd::Client::Attach(options, model);
  if (!attached.ok()) {
    std::fprintf(stderr, "rank %d: attach failed: %s\n", flags.local_rank,
                 attached.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<gradd::Client> client = std::move(attached).value();
  const int rank = client->global_rank();
  const int world = client->world_size();
  std::printf(
      "rank %d/%d: attached to job '%s': %zu tensors, %lld float32 params "
      "(%.1f MiB), %d buckets\n",
      rank, world, flags.job.c_str(), model.size(),
      static_cast<long long>(numel), numel * 4.0 / (1 << 20),
      client->num_buckets());
  std::fflush(stdout);
  if (flags.mode == "train") return Train(flags, *client);

  const float rank_term = static_cast<float>(2 * rank - (world - 1)) * 0.5f;
  int64_t verified = 0;
  double wait_seconds = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int iter = 0; iter < flags.iterations; ++iter) {
    const uint64_t t = client->iteration();
    // Backward: last layers first, each tensor handed over when written.
    for (int p = client->num_params() - 1; p >= 0; --p) {
      float* g = static_cast<float*>(client->gradient(p));
      const size_t n = client->gradient_bytes(p) / sizeof(float);
      for (size_t j = 0; j < n; ++j) g[j] = Expected(t, p, j) + rank_term;
      if (auto s = client->MarkReady(p); !s.ok()) {
        std::fprintf(stderr, "rank %d: iteration %llu: %s\n", rank,
                     static_cast<unsigned long long>(t), s.ToString().c_str());
        return 1;
      }
    }
    const auto wait_start = std::chrono::steady_clock::now();
    if (auto s = client->WaitAll(); !s.ok()) {
      std::fprintf(stderr, "rank %d: iteration %llu: %s\n", rank,
                   static_cast<unsigned long long>(t), s.ToString().c_str());
      return 1;
    }
    wait_seconds += std::chrono::duration<double>(
                        std::chrono::steady_clock::now() - wait_start)
                        .count();
    // The optimizer step would read the averages here; we check them all.
    for (int p = 0; p < client->num_params(); ++p) {
      const float* g = static_cast<const float*>(client->gradient(p));
      const size_t n = client->gradient_bytes(p) / sizeof(float);
      for (size_t j = 0; j < n; ++j) {
        const float want = Expected(t, p, j);
        if (g[j] != want) {
          std::fprintf(stderr,
                       "rank %d: MISMATCH in iteration %llu: %s[%zu] = %.9g, "
                       "expected %.9g (the average over %d ranks)\n",
                       rank, static_cast<unsigned long long>(t),
                       model[p].name.c_str(), j, g[j], want, world);
          return 1;
        }
      }
      verified += static_cast<int64_t>(n);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf(
      "rank %d/%d: %d iterations in %.2f s: %.1f iterations/s "
      "(%.2f ms/iteration waiting for the daemon); verified %lld values\n",
      rank, world, flags.iterations, seconds, flags.iterations / seconds,
      flags.iterations ? 1e3 * wait_seconds / flags.iterations : 0.0,
      static_cast<long long>(verified));
  if (auto s = client->Detach(); !s.ok()) {
    std::fprintf(stderr, "rank %d: detach: %s\n", rank, s.ToString().c_str());
  }
  return 0;
}
