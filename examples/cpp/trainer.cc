// A synthetic data-parallel trainer on gradd (used by scripts/demo).
//
// Registers a model of about --params float32 parameters in tensors of
// varied sizes (so the daemon plans several buckets), then for each
// iteration writes every gradient straight into gradd's shared bucket
// memory in reverse registration order -- as backward would -- marking each
// tensor ready as soon as it is written, waits for the averages and checks
// every averaged value.
//
// Gradient of element j of tensor p on rank r in iteration t (L ranks):
//   g = c(t, p, j) + (2r - (L - 1)) / 2,  c = (((j + 7t + 13p) mod 64) - 32) /
//   2
// The rank terms sum to zero, every partial sum is a small multiple of 1/2
// (exact in float32), so the average is exactly c whatever the order of
// summation: any difference is a real error, not rounding.
//
//   gradd_example_trainer --socket /tmp/gradd.sock --local-rank 0
//       --local-world-size 2 [--job demo] [--iterations 50] [--params 10000000]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
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
};

void Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--socket PATH] [--job ID] --local-rank R "
               "--local-world-size L [--iterations N] [--params P]\n",
               argv0);
}

// Accepts --name=value and --name value.
bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
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
