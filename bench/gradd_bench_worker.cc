// gradd-bench's trainer processes (gradd_bench.h): one hidden --worker
// process per global rank runs every size as one local rank of that size's
// job and writes its timed iterations' stamps to its --out file, one
// "size mark_ns done_ns" line each, for the coordinator to collect
// (gradd_bench_report.cc). The fill / barrier / mark / wait / check loop is
// drawn in gradd_bench.cc's header.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_support.h"
#include "bench/gpu_bench.h"
#include "bench/gradd_bench.h"
#include "common/status_macros.h"
#include "gradd/client.h"

namespace gradd::bench {
namespace {

constexpr std::chrono::milliseconds kBarrierTimeout{60000};
// The coordinator measures a size's reference while the workers wait.
constexpr std::chrono::milliseconds kGateTimeout{600000};

// The average all ranks expect in iteration i.
float ExpectedAverage(int ranks, int iteration) {
  float sum = 0;
  for (int r = 0; r < ranks; ++r) sum += FillValue(r, iteration);
  return static_cast<float>(static_cast<double>(sum) / ranks);
}

// --matrix_cols: the gradient is FillValue times this fixed rank-4 matrix
// (singular values within a factor 2.5 of each other)
// (small integers, so sums and averages stay exact in float32), which a
// rank-4 PowerSGD recovers up to rounding; a constant matrix (rank 1) would
// leave Gram-Schmidt orthogonalising rounding noise.
float Pattern(size_t row, size_t col) {
  float v = 0;
  for (size_t k = 0; k < 4; ++k) {
    v +=
        static_cast<float>(static_cast<int>((row * (k + 1) + k * k) % 11) - 5) *
        static_cast<float>(static_cast<int>((col * (k + 3) + 2 * k) % 13) - 6);
  }
  return v;
}

// Relative to max(|want|, floor): floor 1 for a constant gradient; for a
// pattern, the largest |value| of the expected matrix, since a low-rank
// reconstruction's rounding is that of the matrix's scale (a zero of the
// pattern comes back as the rounding of sums of its large terms).
absl::Status CheckValue(float got, float want, uint64_t size, int iteration,
                        size_t index, double tolerance, float floor = 1.0f) {
  if (std::fabs(got - want) <= tolerance * std::max(floor, std::fabs(want))) {
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrFormat(
      "wrong average: size %d iteration %d element %d = %g, expected %g", size,
      iteration, index, got, want));
}

absl::Status RunWorkerSize(const Settings& s, int rank, uint64_t size,
                           const std::string& socket,  // this node's daemon
                           const std::string& job_prefix, SharedBarrier& gate,
                           SharedBarrier& barrier, std::FILE* out) {
  // Two rounds of the gate per size: the first tells the coordinator that
  // every worker is parked (the previous size's job is over), the second
  // lets us go once it has measured this size's reference. Measuring while
  // a job runs would disturb both.
  RETURN_IF_ERROR(gate.Arrive(kGateTimeout));
  RETURN_IF_ERROR(gate.Arrive(kGateTimeout));
  const size_t numel = size / sizeof(float);
  ClientOptions options;
  options.socket_path = socket;
  options.job_id = JobId(job_prefix, size);
  // Worker `rank` is global rank `rank`: local rank rank % L of node
  // rank / L.
  options.local_rank = rank % s.trainers;
  options.local_world_size = s.trainers;
  if (s.nodes > 1) {
    options.num_nodes = s.nodes;
    options.node_rank = rank / s.trainers;
    options.node_id = absl::StrCat("bench-node", rank / s.trainers);
    options.coordinator = s.coordinator_host;
  }
  // One parameter is always one bucket; caps above its size keep it so
  // whatever the planner does with small parameters.
  const double mb = static_cast<double>(size) / (1 << 20) + 1;
  options.bucket_cap_mb = mb;
  options.first_bucket_cap_mb = mb;
  std::vector<int64_t> shape = {static_cast<int64_t>(numel)};
  if (s.matrix_cols > 0) {
    if (numel % s.matrix_cols != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("size ", size, " is not a whole number of rows of ",
                       s.matrix_cols, " float32 columns"));
    }
    shape = {static_cast<int64_t>(numel) / s.matrix_cols, s.matrix_cols};
  }
  std::vector<ClientParam> params = {{"grad", shape, 1 /* float32 */}};
  if (s.cuda) {
    if (s.matrix_cols > 0) {
      return absl::InvalidArgumentError(
          "--matrix_cols (a PowerSGD pattern) is CPU only; drop it with "
          "--device cuda");
    }
    RETURN_IF_ERROR(GpuInit());
    params[0].device = 1;
    options.cuda_device = 0;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
                   Client::Attach(options, params));
  if (client->gradient_bytes(0) != numel * sizeof(float)) {
    return absl::InternalError(
        absl::StrCat("gradient 0 has ", client->gradient_bytes(0),
                     " bytes, expected ", numel * sizeof(float)));
  }
  float* grad = static_cast<float*>(client->gradient(0));
  std::vector<float> pattern;
  if (s.matrix_cols > 0) {
    pattern.resize(numel);
    const size_t cols = static_cast<size_t>(s.matrix_cols);
    for (size_t k = 0; k < numel; ++k) pattern[k] = Pattern(k / cols, k % cols);
  }
  auto scale = [&](size_t k) { return pattern.empty() ? 1.0f : pattern[k]; };
  float pattern_max = 1.0f;
  for (float v : pattern) pattern_max = std::max(pattern_max, std::fabs(v));
  std::vector<Stamp> stamps;
  stamps.reserve(s.iters);
  const int total = s.warmup + s.iters;
  for (int i = 0; i < total; ++i) {
    if (s.cuda) {
      RETURN_IF_ERROR(GpuFill(grad, numel, FillValue(rank, i)));
    } else if (pattern.empty()) {
      std::fill(grad, grad + numel, FillValue(rank, i));
    } else {
      const float v = FillValue(rank, i);
      for (size_t k = 0; k < numel; ++k) grad[k] = v * pattern[k];
    }
    RETURN_IF_ERROR(barrier.Arrive(kBarrierTimeout, nullptr, rank));
    const int64_t mark = NowNs();
    // CUDA: the legacy default stream (the fill's); done = the stream has
    // waited for the daemon's reduction and gone idle.
    RETURN_IF_ERROR(client->MarkReadyOn(0, nullptr));
    RETURN_IF_ERROR(client->WaitAllOn(nullptr));
    if (s.cuda) RETURN_IF_ERROR(GpuSync());
    const int64_t done = NowNs();
    if (i >= s.warmup) stamps.push_back({mark, done});
    const float want = ExpectedAverage(s.trainers * s.nodes, i);
    if (s.cuda) {
      ASSIGN_OR_RETURN(std::vector<float> back, GpuRead(grad, numel));
      for (size_t k = 0; k < numel; k += i + 1 < total ? numel / 2 + 1 : 1) {
        RETURN_IF_ERROR(CheckValue(back[k], want, size, i, k, s.tolerance));
      }
      RETURN_IF_ERROR(
          CheckValue(back[numel - 1], want, size, i, numel - 1, s.tolerance));
    } else if (i + 1 < total) {
      for (size_t k : {size_t{0}, numel / 2, numel - 1}) {
        RETURN_IF_ERROR(CheckValue(grad[k], want * scale(k), size, i, k,
                                   s.tolerance, std::fabs(want) * pattern_max));
      }
    } else {
      for (size_t k = 0; k < numel; ++k) {
        RETURN_IF_ERROR(CheckValue(grad[k], want * scale(k), size, i, k,
                                   s.tolerance, std::fabs(want) * pattern_max));
      }
    }
  }
  RETURN_IF_ERROR(client->Detach());
  for (const Stamp& st : stamps) {
    std::fprintf(out, "%" PRIu64 " %" PRId64 " %" PRId64 "\n", size, st.mark_ns,
                 st.done_ns);
  }
  std::fflush(out);
  return absl::OkStatus();
}

}  // namespace

int WorkerMain(const Settings& s, int rank) {
  absl::Status status = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(SharedBarrier barrier,
                     SharedBarrier::Open(s.barrier, s.trainers * s.nodes));
    ASSIGN_OR_RETURN(SharedBarrier gate,
                     SharedBarrier::Open(s.gate, s.trainers * s.nodes + 1));
    const std::string out_path = s.out;
    std::FILE* out = std::fopen(out_path.c_str(), "w");
    if (out == nullptr) {
      return absl::InternalError(absl::StrCat("cannot write ", out_path));
    }
    absl::Status st;
    for (uint64_t size : s.sizes) {
      st = RunWorkerSize(s, rank, size, s.socket, s.job_prefix, gate, barrier,
                         out);
      if (!st.ok()) break;
    }
    if (std::fclose(out) != 0 && st.ok()) {
      st = absl::InternalError(absl::StrCat("cannot write ", out_path));
    }
    return st;
  }();
  if (!status.ok()) {
    std::fprintf(stderr, "gradd-bench worker %d: %s\n", rank,
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace gradd::bench
