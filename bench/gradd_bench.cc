// gradd-bench: the ready->done latency of gradd's data path against a real
// daemon and real trainer processes, nccl-tests style.
//
//   gradd-bench --trainers 2 --sizes 4KiB,64KiB,1MiB,25MiB,128MiB
//   gradd-bench --trainers 2 --format=json          # one JSON object per size
//
// What runs: the bench starts `gradd` (--gradd, default ../server/gradd next
// to this binary) on a socket in a fresh temp dir, or uses a running daemon
// (--socket), and re-executes itself L times as hidden --worker processes:
// one local rank each of an L-rank job. Per size, every worker attaches a new
// job with one float32 parameter of that size (so one bucket), then runs
// warm-up and timed iterations:
//
//   fill its gradient (rank + 1 + i % 8)       not timed
//   barrier across the workers                 not timed
//   t_mark = now; MarkReady(0); WaitAll(); t_done = now
//   check the average (3 elements; every element on the last iteration)
//
// Time of an iteration = max over workers of t_done - max over workers of
// t_mark: from the moment the last trainer marked its bucket ready until the
// last trainer holds the averaged gradient (CLOCK_MONOTONIC, the same clock
// in every process). p50/p90 are taken over the timed iterations.
//
// Reference: right before each size's job (the previous job is over, the
// workers wait at a gate, the daemon is idle), this process measures gradd's
// own FusedAverage kernel averaging L in-place float32 buffers of that size,
// split over all cores with the daemon's ThreadPool (p50 over the same number
// of iterations). bound_fraction = reference p50 / gradd p50: how close the
// whole path (doorbells, scheduling, wake-ups) comes to the memory-bound work
// it has to do. Measuring it at the same moment keeps the ratio honest on a
// machine whose load changes.
//
// --nodes N: N daemons on this machine, each one node of an N x L job
// (hierarchical: local reduce, Gloo allreduce between the daemons over
// loopback TCP, write-back). Node 0's daemon serves the rendezvous on an
// OS-chosen port; worker w is local rank w % L of node w / L, global rank w.
// The daemons log each job's cumulative per-phase times when it ends; the
// bench reads them back and prints the mean per bucket (local reduce,
// network, write-back), averaged over the nodes.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "bench/bench_support.h"
#include "bench/gpu_bench.h"
#include "common/dtype.h"
#include "common/reduce.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "gradd/client.h"

ABSL_FLAG(int, trainers, 2, "Local trainer processes per node (L).");
ABSL_FLAG(std::string, device, "cpu",
          "Where the gradients live: cpu (shared memory) or cuda (every "
          "trainer on GPU 0, daemon-allocated device memory, IPC events).");
ABSL_FLAG(std::string, gradd_config, "",
          "YAML config passed to every daemon the bench starts (--config); "
          "--socket, --node-id and the rendezvous flags still come from the "
          "bench.");
ABSL_FLAG(int, nodes, 1,
          "Node daemons (N) on this machine; N > 1 runs the hierarchical "
          "multi-node path (rendezvous + Gloo over loopback).");
ABSL_FLAG(
    std::string, sizes, "4KiB,64KiB,1MiB,25MiB,128MiB",
    "Comma-separated gradient sizes in bytes (B, KiB, MiB, GiB, KB, MB).");
ABSL_FLAG(int, iters, 100, "Timed iterations per size.");
ABSL_FLAG(int, warmup, 10, "Warm-up iterations per size (not timed).");
ABSL_FLAG(std::string, format, "table", "Output: table (human) or json.");
ABSL_FLAG(std::string, gradd, "",
          "Path of the gradd daemon (default: ../server/gradd next to this "
          "binary).");
ABSL_FLAG(std::string, socket, "",
          "Use the gradd daemon already serving this socket instead of "
          "starting one.");
ABSL_FLAG(int, threads, 0,
          "Threads for the reference kernel (0 = number of cores).");
ABSL_FLAG(int, timeout_s, 900, "Give up (and clean up) after this long.");
// Emulated clusters (scripts/netbench): node n's daemon runs under a command
// prefix, e.g. "ip netns exec gnb-n{node}"; the trainers stay here (their
// daemon's socket is a file) and name the coordinator's host as torchrun's
// MASTER_ADDR would, so the daemons discover it (docs/operations.md).
ABSL_FLAG(std::string, node_exec, "",
          "Command prefix for node {node}'s daemon (multi-node; with "
          "--coordinator_host)");
ABSL_FLAG(std::string, coordinator_host, "",
          "Host the trainers name as the coordinator (MASTER_ADDR); the "
          "daemons discover it on --rendezvous_port instead of the bench "
          "wiring them up");
ABSL_FLAG(int, rendezvous_port, 29600,
          "The daemons' rendezvous port with --coordinator_host");
ABSL_FLAG(int64_t, matrix_cols, 0,
          "Register the gradient as a [size / 4 / cols, cols] matrix (a "
          "Linear weight's shape, which PowerSGD compresses) instead of a "
          "vector");
ABSL_FLAG(double, tolerance, 1e-6,
          "Relative error allowed in the checked average (raise it for lossy "
          "comm hooks such as PowerSGD; with --matrix_cols, relative to the "
          "largest element of the expected matrix)");
// Internal: how the bench runs its trainer processes.
ABSL_FLAG(int, worker, -1, "(internal) run as trainer process of this rank");
ABSL_FLAG(std::string, barrier, "", "(internal) per-iteration barrier file");
ABSL_FLAG(std::string, gate, "", "(internal) per-size gate barrier file");
ABSL_FLAG(std::string, out, "", "(internal) worker result file");
ABSL_FLAG(std::string, job_prefix, "", "(internal) job id prefix");

namespace gradd::bench {
namespace {

constexpr std::chrono::milliseconds kBarrierTimeout{60000};
// The coordinator measures a size's reference while the workers wait.
constexpr std::chrono::milliseconds kGateTimeout{600000};

struct Settings {
  int trainers = 2;
  int nodes = 1;
  std::vector<uint64_t> sizes;
  int iters = 100;
  int warmup = 10;
  bool json = false;
  int64_t matrix_cols = 0;
  double tolerance = 1e-6;
  std::string coordinator_host;
  bool cuda = false;  // --device cuda
};

// One timed iteration as one worker saw it.
struct Stamp {
  int64_t mark_ns;
  int64_t done_ns;
};

// The reference kernel p50s (MeasureReference).
struct Reference {
  double produced_us = 0;
  double hot_us = 0;
};

struct SizeResult {
  uint64_t size_bytes = 0;
  std::vector<double> iteration_us;  // per timed iteration
  Reference ref;                     // reference kernel p50s
  // Mean per bucket over the job (warm-up included), averaged over the
  // nodes, from the daemons' logs; negative when not found.
  double local_reduce_us = -1;
  double network_us = -1;
  double write_back_us = -1;
};

absl::StatusOr<Settings> ReadSettings() {
  Settings s;
  s.trainers = absl::GetFlag(FLAGS_trainers);
  s.nodes = absl::GetFlag(FLAGS_nodes);
  s.iters = absl::GetFlag(FLAGS_iters);
  s.warmup = absl::GetFlag(FLAGS_warmup);
  s.matrix_cols = absl::GetFlag(FLAGS_matrix_cols);
  s.tolerance = absl::GetFlag(FLAGS_tolerance);
  s.coordinator_host = absl::GetFlag(FLAGS_coordinator_host);
  if (s.matrix_cols < 0 || !(s.tolerance >= 0)) {
    return absl::InvalidArgumentError(
        "--matrix_cols and --tolerance must not be negative");
  }
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "table" && format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format=", format, ": use table or json"));
  }
  s.json = format == "json";
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", device, ": use cpu or cuda"));
  }
  s.cuda = device == "cuda";
  if (s.cuda && absl::GetFlag(FLAGS_nodes) > 1) {
    return absl::InvalidArgumentError(
        "--device cuda runs one node (the NCCL path between nodes is not "
        "wired yet)");
  }
  if (s.trainers < 1 || s.trainers > 256) {
    return absl::InvalidArgumentError("--trainers must be in [1, 256]");
  }
  if (s.nodes < 1) return absl::InvalidArgumentError("--nodes must be >= 1");
  if (s.iters < 1) return absl::InvalidArgumentError("--iters must be >= 1");
  if (s.warmup < 0) return absl::InvalidArgumentError("--warmup must be >= 0");
  ASSIGN_OR_RETURN(s.sizes, ParseSizeList(absl::GetFlag(FLAGS_sizes)));
  for (uint64_t& size : s.sizes) {
    if (size < sizeof(float)) {
      return absl::InvalidArgumentError(
          absl::StrCat("size ", size, " is smaller than one float32"));
    }
    size -= size % sizeof(float);
  }
  return s;
}

std::string JobId(const std::string& prefix, uint64_t size) {
  return absl::StrCat(prefix, "-", size);
}

// --- Worker: one trainer process --------------------------------------------

// Value rank r writes in iteration i, and the average all ranks expect.
float FillValue(int rank, int iteration) {
  return static_cast<float>(rank + 1 + iteration % 8);
}
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
    RETURN_IF_ERROR(barrier.Arrive(kBarrierTimeout));
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

int WorkerMain(const Settings& s, int rank) {
  const std::string socket = absl::GetFlag(FLAGS_socket);
  absl::Status status = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(SharedBarrier barrier,
                     SharedBarrier::Open(absl::GetFlag(FLAGS_barrier),
                                         s.trainers * s.nodes));
    ASSIGN_OR_RETURN(SharedBarrier gate,
                     SharedBarrier::Open(absl::GetFlag(FLAGS_gate),
                                         s.trainers * s.nodes + 1));
    const std::string out_path = absl::GetFlag(FLAGS_out);
    std::FILE* out = std::fopen(out_path.c_str(), "w");
    if (out == nullptr) {
      return absl::InternalError(absl::StrCat("cannot write ", out_path));
    }
    absl::Status st;
    for (uint64_t size : s.sizes) {
      st = RunWorkerSize(s, rank, size, socket, absl::GetFlag(FLAGS_job_prefix),
                         gate, barrier, out);
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

// SIGINT / SIGTERM while the bench runs: stop waiting, clean up, exit.
std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal.store(sig); }

// --- Reference: the memory-bound work of one local average ------------------

// The reference, two ways (p50 us of FusedAverage over `ranks` in-place
// float32 buffers of `size` bytes, split over `pool`; page faults are never
// measured):
//   produced  before each timed pass, one thread per rank rewrites that
//             rank's buffer, as the trainers do before they mark a bucket
//             ready; the pass then finds the data where the daemon finds
//             it: dirty in other cores' caches, or in DRAM once the buffers
//             outgrow the last-level cache. This is the memory-bound work
//             the daemon cannot avoid, and bound_fraction is taken against
//             it.
//   hot       back-to-back passes over the same buffers, which stay in
//             this core's caches as far as they fit (on the development VM
//             2 x 25 MiB averages in ~0.55 ms hot against ~1.0 ms
//             produced). Printed beside it so the gap stays visible.
Reference MeasureReference(ThreadPool& pool, uint64_t size, int ranks,
                           int iterations) {
  const size_t numel = size / sizeof(float);
  std::vector<std::unique_ptr<float[]>> storage;
  std::vector<void*> buffers;
  for (int r = 0; r < ranks; ++r) {
    storage.emplace_back(new float[numel]);
    std::fill(storage.back().get(), storage.back().get() + numel,
              static_cast<float>(r + 1));
    buffers.push_back(storage.back().get());
  }
  // Below ~64 KiB a second thread costs more than it saves (as in the
  // daemon, which keeps small buckets on one thread).
  constexpr size_t kMinChunk = (64 << 10) / sizeof(float);
  auto pass = [&] {
    const int64_t start = NowNs();
    pool.ParallelFor(numel, kMinChunk, [&](size_t begin, size_t end) {
      FusedAverage(DType::kFloat32, buffers.data(), ranks, begin, end, ranks);
    });
    return (NowNs() - start) / 1e3;
  };
  auto produce = [&](int iteration) {
    std::vector<std::thread> producers;
    for (int r = 0; r < ranks; ++r) {
      producers.emplace_back([&, r] {
        float* b = storage[r].get();
        std::fill(b, b + numel, FillValue(r, iteration));
      });
    }
    for (std::thread& t : producers) t.join();
  };
  const int total = iterations + std::max(3, iterations / 10);
  std::vector<double> hot, produced;
  for (int i = 0; i < total && g_signal.load() == 0; ++i) {
    const double us = pass();
    if (i >= total - iterations) hot.push_back(us);
  }
  for (int i = 0; i < total && g_signal.load() == 0; ++i) {
    produce(i);
    const double us = pass();
    if (i >= total - iterations) produced.push_back(us);
  }
  Reference ref;
  ref.hot_us = Percentile(std::move(hot), 50);
  ref.produced_us = Percentile(std::move(produced), 50);
  return ref;
}

// --- Coordinator: daemons, workers, results ---------------------------------

// Where the daemons and trainers run. Single node today; the multi-node mode
// (issue 3) adds one daemon per node, the first serving rendezvous, and
// trainers of node n attaching to daemon n with node_rank n.
struct Topology {
  int nodes = 1;
  int trainers = 1;
  int world() const { return nodes * trainers; }
};

struct Daemons {
  std::vector<Child> children;       // empty when using --socket
  std::vector<std::string> sockets;  // one per node
  std::vector<std::string> logs;
};

// The port number the coordinator daemon writes to `path` once it listens.
absl::StatusOr<int> WaitForPortFile(const std::string& path, Child* daemon,
                                    std::chrono::milliseconds timeout) {
  const int64_t deadline = NowNs() + std::chrono::nanoseconds(timeout).count();
  while (true) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    if (std::optional<int> status = daemon->Poll()) {
      return absl::UnavailableError(
          absl::StrCat("the coordinator daemon ", DescribeWaitStatus(*status),
                       " before writing its rendezvous port"));
    }
    if (NowNs() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no rendezvous port in ", path, " after ", timeout.count(), " ms"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// The emulated cluster's shared secret (rendezvous.token_file): a daemon
// configured for several nodes refuses to start without credentials. A
// fresh random token in the run's private directory, mode 0600.
absl::StatusOr<std::string> WriteNodeToken(const std::string& dir) {
  std::ifstream random("/dev/urandom", std::ios::binary);
  unsigned char bytes[24];
  if (!random.read(reinterpret_cast<char*>(bytes), sizeof(bytes))) {
    return absl::UnavailableError("cannot read /dev/urandom for a token");
  }
  std::string token;
  for (unsigned char b : bytes) {
    absl::StrAppend(&token, absl::Hex(b, absl::kZeroPad2));
  }
  const std::string path = absl::StrCat(dir, "/node-token");
  std::ofstream(path) << token << "\n";
  if (chmod(path.c_str(), 0600) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot write ", path));
  }
  return path;
}

absl::StatusOr<Daemons> StartDaemons(const Topology& topo,
                                     const std::string& dir) {
  Daemons d;
  const std::string external = absl::GetFlag(FLAGS_socket);
  if (!external.empty()) {
    if (topo.nodes > 1) {
      return absl::InvalidArgumentError(
          "--socket (an external daemon) is for --nodes 1 only");
    }
    d.sockets.push_back(external);
    return d;
  }
  std::string gradd = absl::GetFlag(FLAGS_gradd);
  if (gradd.empty()) gradd = SelfDir() + "/../server/gradd";
  if (access(gradd.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("no gradd executable at ", gradd,
                                            " (build it, or pass --gradd)"));
  }
  const std::string port_file = absl::StrCat(dir, "/rendezvous.port");
  std::string coordinator;
  std::string token_file;
  if (topo.nodes > 1) {
    ASSIGN_OR_RETURN(token_file, WriteNodeToken(dir));
  }
  for (int n = 0; n < topo.nodes; ++n) {
    const std::string socket = absl::StrCat(dir, "/node", n, "/gradd.sock");
    const std::string log = absl::StrCat(dir, "/gradd", n, ".log");
    Child::Options opts;
    opts.output_file = log;
    opts.death_signal = SIGTERM;
    std::vector<std::string> argv = {gradd, "--socket", socket};
    if (const std::string config = absl::GetFlag(FLAGS_gradd_config);
        !config.empty()) {
      argv.insert(argv.end(), {"--config", config});
    }
    if (const std::string prefix = absl::GetFlag(FLAGS_node_exec);
        !prefix.empty()) {
      std::vector<std::string> wrapped = absl::StrSplit(
          absl::StrReplaceAll(prefix, {{"{node}", absl::StrCat(n)}}), ' ',
          absl::SkipEmpty());
      argv.insert(argv.begin(), wrapped.begin(), wrapped.end());
    }
    if (topo.nodes > 1) {
      argv.insert(argv.end(), {"--rendezvous-token-file", token_file});
    }
    if (topo.nodes > 1 && !absl::GetFlag(FLAGS_coordinator_host).empty()) {
      // Discovery: the daemon on the coordinator host serves on demand.
      argv.insert(
          argv.end(),
          {"--node-id", absl::StrCat("bench-node", n), "--rendezvous-port",
           absl::StrCat(absl::GetFlag(FLAGS_rendezvous_port))});
    } else if (topo.nodes > 1) {
      argv.insert(argv.end(), {"--node-id", absl::StrCat("bench-node", n)});
      if (n == 0) {
        argv.insert(argv.end(), {"--rendezvous-listen", "127.0.0.1:0",
                                 "--rendezvous-port-file", port_file});
      } else {
        argv.insert(argv.end(), {"--coordinator", coordinator});
      }
    }
    ASSIGN_OR_RETURN(Child child, Child::Spawn(argv, opts));
    d.children.push_back(std::move(child));
    d.sockets.push_back(socket);
    d.logs.push_back(log);
    if (topo.nodes > 1 && n == 0 &&
        absl::GetFlag(FLAGS_coordinator_host).empty()) {
      // The coordinator's OS-chosen port, written (whole, by rename) once
      // it listens.
      ASSIGN_OR_RETURN(int port, WaitForPortFile(port_file, &d.children[0],
                                                 std::chrono::seconds(20)));
      coordinator = absl::StrCat("127.0.0.1:", port);
    }
  }
  for (int n = 0; n < topo.nodes; ++n) {
    for (const std::string& path : {d.sockets[n], d.sockets[n] + ".session"}) {
      RETURN_IF_ERROR(WaitForSocket(path, &d.children[n],
                                    std::chrono::milliseconds(20000)));
    }
  }
  return d;
}

// Fills r's phase split from the daemons' "job '<id>' ended: B buckets
// reduced; phase split ms: local_reduce=X network=Y write_back=Z" lines.
void ReadPhaseSplit(const std::vector<std::string>& logs,
                    const std::string& job_id, SizeResult* r) {
  const std::string key = absl::StrCat("job '", job_id, "' ended: ");
  double local = 0, network = 0, write_back = 0;
  int nodes = 0;
  for (const std::string& log : logs) {
    std::ifstream in(log);
    std::string line;
    while (std::getline(in, line)) {
      const size_t at = line.find(key);
      if (at == std::string::npos) continue;
      double buckets = 0, l = 0, n = 0, w = 0;
      if (std::sscanf(line.c_str() + at + key.size(),
                      "%lf buckets reduced; phase split ms: local_reduce=%lf "
                      "network=%lf write_back=%lf",
                      &buckets, &l, &n, &w) == 4 &&
          buckets > 0) {
        local += l * 1e3 / buckets;
        network += n * 1e3 / buckets;
        write_back += w * 1e3 / buckets;
        ++nodes;
      }
    }
  }
  if (nodes == 0) return;
  r->local_reduce_us = local / nodes;
  r->network_us = network / nodes;
  r->write_back_us = write_back / nodes;
}

std::string Tail(const std::string& path, size_t max_bytes = 4000) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  if (text.size() > max_bytes) text = text.substr(text.size() - max_bytes);
  return text;
}

// Reads the workers' stamp files and turns them into per-iteration times.
absl::StatusOr<std::map<uint64_t, SizeResult>> CollectResults(
    const Settings& s, const std::vector<std::string>& outs) {
  // size -> iteration -> per-worker stamps
  std::map<uint64_t, std::vector<std::vector<Stamp>>> stamps;
  for (const std::string& path : outs) {
    std::ifstream in(path);
    if (!in) return absl::InternalError(absl::StrCat("cannot read ", path));
    std::map<uint64_t, int> seen;
    uint64_t size;
    Stamp st;
    while (in >> size >> st.mark_ns >> st.done_ns) {
      auto& per_iter = stamps[size];
      const int i = seen[size]++;
      if (per_iter.size() <= static_cast<size_t>(i)) per_iter.resize(i + 1);
      per_iter[i].push_back(st);
    }
  }
  std::map<uint64_t, SizeResult> results;
  for (uint64_t size : s.sizes) {
    SizeResult& r = results[size];
    r.size_bytes = size;
    for (const std::vector<Stamp>& iter : stamps[size]) {
      if (iter.size() != outs.size()) {
        return absl::InternalError(
            absl::StrCat("size ", size, ": an iteration has stamps from ",
                         iter.size(), " of ", outs.size(), " workers"));
      }
      int64_t last_mark = 0, last_done = 0;
      for (const Stamp& st : iter) {
        last_mark = std::max(last_mark, st.mark_ns);
        last_done = std::max(last_done, st.done_ns);
      }
      r.iteration_us.push_back((last_done - last_mark) / 1e3);
    }
    if (r.iteration_us.size() != static_cast<size_t>(s.iters)) {
      return absl::InternalError(
          absl::StrCat("size ", size, ": ", r.iteration_us.size(),
                       " timed iterations, ", "expected ", s.iters));
    }
  }
  return results;
}

void PrintHeader(const Settings& s, const Topology& topo, int ref_threads) {
  std::printf(
      "# gradd-bench: %d node(s) x %d trainer(s), float32, one bucket per "
      "size, %d warm-up + %d timed iterations\n"
      "# time = last trainer's MarkReady -> last trainer's WaitAll return "
      "(ready->done)\n"
      "# algbw = size / p50; busbw = algbw * 2(n-1)/n (n = %d ranks, "
      "nccl-tests convention)\n"
      "# ref = p50 of gradd's FusedAverage of %d in-place buffers on %d "
      "thread(s) in this process, each buffer rewritten by its own thread "
      "first (as the trainers do); bound = ref / p50; hot = the same "
      "average repeated on cache-resident buffers\n#\n",
      topo.nodes, topo.trainers, s.warmup, s.iters, topo.world(), topo.trainers,
      ref_threads);
  if (s.cuda) {
    std::printf(
        "# --device cuda: every trainer on GPU 0; time includes the trainer's "
        "stream waiting for the daemon's done event; ref = %d x p50 of one "
        "in-place device copy of the size (the device's own copy bandwidth, "
        "measured in this run, for the 2 x %d x size bytes a fused average "
        "moves), so bound = the fraction of that bandwidth reached; hot = "
        "the fused device kernel alone\n#\n",
        topo.trainers, topo.trainers);
  }
  if (topo.nodes > 1) {
    std::printf(
        "# local/net/wb = mean per bucket of the daemons' local reduce, "
        "inter-node allreduce and write-back (us, averaged over nodes)\n#\n");
  }
  std::printf("# %12s %12s %10s %10s %10s %12s %12s %10s %7s %9s", "size",
              "count", "p50(us)", "p90(us)", "min(us)", "algbw(GB/s)",
              "busbw(GB/s)", "ref(us)", "bound", "hot(us)");
  if (topo.nodes > 1) {
    std::printf(" %10s %10s %10s", "local(us)", "net(us)", "wb(us)");
  }
  std::printf("\n");
}

void PrintRow(const Settings& s, const Topology& topo, const SizeResult& r) {
  const double p50 = Percentile(r.iteration_us, 50);
  const double p90 = Percentile(r.iteration_us, 90);
  const double min = Percentile(r.iteration_us, 0);
  double mean = 0;
  for (double v : r.iteration_us) mean += v;
  mean /= r.iteration_us.size();
  const double max = Percentile(r.iteration_us, 100);
  const double algbw = p50 > 0 ? r.size_bytes / (p50 * 1e3) : 0;  // GB/s
  const int n = topo.world();
  const double busbw = n > 1 ? algbw * 2.0 * (n - 1) / n : algbw;
  const double bound = p50 > 0 ? r.ref.produced_us / p50 : 0;
  const double bound_hot = p50 > 0 ? r.ref.hot_us / p50 : 0;
  if (s.json) {
    std::printf(
        "{\"size_bytes\": %" PRIu64
        ", \"p50_us\": %.3f, \"p90_us\": %.3f, \"algbw_gbps\": %.4f, "
        "\"bound_fraction\": %.4f, \"busbw_gbps\": %.4f, \"ref_us\": %.3f, "
        "\"ref_hot_us\": %.3f, \"bound_fraction_hot\": %.4f, "
        "\"min_us\": %.3f, \"mean_us\": %.3f, \"max_us\": %.3f, "
        "\"trainers\": %d, \"nodes\": %d, \"iters\": %d, \"warmup\": %d, "
        "\"local_reduce_us\": %.3f, \"network_us\": %.3f, "
        "\"write_back_us\": %.3f, \"dtype\": \"float32\", "
        "\"device\": \"%s\"}\n",
        r.size_bytes, p50, p90, algbw, bound, busbw, r.ref.produced_us,
        r.ref.hot_us, bound_hot, min, mean, max, topo.trainers, topo.nodes,
        s.iters, s.warmup, r.local_reduce_us, r.network_us, r.write_back_us,
        s.cuda ? "cuda" : "cpu");
  } else {
    std::printf("  %12" PRIu64 " %12" PRIu64
                " %10.1f %10.1f %10.1f %12.2f %12.2f %10.1f %7.3f %9.1f",
                r.size_bytes, r.size_bytes / sizeof(float), p50, p90, min,
                algbw, busbw, r.ref.produced_us, bound, r.ref.hot_us);
    if (topo.nodes > 1) {
      std::printf(" %10.1f %10.1f %10.1f", r.local_reduce_us, r.network_us,
                  r.write_back_us);
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

int CoordinatorMain(const Settings& s) {
  const Topology topo{s.nodes, s.trainers};
  auto fail = [](const absl::Status& st) {
    std::fprintf(stderr, "gradd-bench: %s\n", st.ToString().c_str());
    switch (st.code()) {
      case absl::StatusCode::kUnimplemented:
        return 2;
      case absl::StatusCode::kCancelled:
        return 128 + std::max(1, g_signal.load());
      default:
        return 1;
    }
  };
  int ref_threads = absl::GetFlag(FLAGS_threads);
  if (ref_threads <= 0) {
    ref_threads = std::max(1u, std::thread::hardware_concurrency());
  }

  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  // 1. Daemon(s) and trainer processes (forked before any thread exists).
  absl::StatusOr<TempDir> dir = TempDir::Create("gradd-bench");
  if (!dir.ok()) return fail(dir.status());
  for (int n = 0; n < topo.nodes; ++n) {
    // gradd creates its socket directory owner-only; pre-creating it 0700
    // is equivalent and keeps the layout obvious.
    mkdir(absl::StrCat(dir->path(), "/node", n).c_str(), 0700);
  }
  absl::StatusOr<Daemons> daemons = StartDaemons(topo, dir->path());
  if (!daemons.ok()) return fail(daemons.status());
  auto dump_daemon_logs = [&] {
    for (const std::string& log : daemons->logs) {
      std::fprintf(stderr, "--- %s ---\n%s\n", log.c_str(), Tail(log).c_str());
    }
  };

  const std::string barrier_path = dir->path() + "/barrier";
  const std::string gate_path = dir->path() + "/gate";
  for (const std::string& path : {barrier_path, gate_path}) {
    if (absl::Status st = SharedBarrier::CreateFile(path); !st.ok()) {
      return fail(st);
    }
  }
  absl::StatusOr<SharedBarrier> gate =
      SharedBarrier::Open(gate_path, topo.world() + 1);
  if (!gate.ok()) return fail(gate.status());
  const std::string job_prefix = absl::StrCat("gradd-bench-", getpid());
  const std::string self = SelfExe();
  std::vector<Child> workers;
  std::vector<std::string> outs;
  for (int r = 0; r < topo.world(); ++r) {
    outs.push_back(absl::StrCat(dir->path(), "/worker", r, ".txt"));
    std::vector<std::string> argv = {
        self,
        absl::StrCat("--worker=", r),
        absl::StrCat("--trainers=", s.trainers),
        absl::StrCat("--sizes=", absl::StrJoin(s.sizes, ",")),
        absl::StrCat("--iters=", s.iters),
        absl::StrCat("--warmup=", s.warmup),
        absl::StrCat("--nodes=", topo.nodes),
        absl::StrCat("--socket=", daemons->sockets[r / topo.trainers]),
        absl::StrCat("--barrier=", barrier_path),
        absl::StrCat("--gate=", gate_path),
        absl::StrCat("--out=", outs.back()),
        absl::StrCat("--job_prefix=", job_prefix),
        absl::StrCat("--matrix_cols=", s.matrix_cols),
        absl::StrCat("--tolerance=", s.tolerance),
        absl::StrCat("--coordinator_host=", s.coordinator_host),
        absl::StrCat("--device=", s.cuda ? "cuda" : "cpu")};
    absl::StatusOr<Child> child = Child::Spawn(argv, Child::Options{});
    if (!child.ok()) return fail(child.status());
    workers.push_back(std::move(*child));
  }

  // The first worker failure, a dead daemon, a signal or the timeout stops
  // everything.
  const int64_t deadline =
      NowNs() + int64_t{absl::GetFlag(FLAGS_timeout_s)} * 1000000000;
  std::vector<bool> reaped(workers.size(), false);
  size_t finished = 0;
  auto check_run = [&]() -> absl::Status {
    for (size_t r = 0; r < workers.size(); ++r) {
      if (reaped[r]) continue;
      if (std::optional<int> st = workers[r].Poll()) {
        reaped[r] = true;
        ++finished;
        if (!WIFEXITED(*st) || WEXITSTATUS(*st) != 0) {
          return absl::InternalError(
              absl::StrCat("worker ", r, " ", DescribeWaitStatus(*st)));
        }
      }
    }
    for (size_t n = 0; n < daemons->children.size(); ++n) {
      if (std::optional<int> st = daemons->children[n].Poll()) {
        return absl::UnavailableError(absl::StrCat("gradd (node ", n, ") ",
                                                   DescribeWaitStatus(*st),
                                                   " during the benchmark"));
      }
    }
    if (g_signal.load() != 0) {
      return absl::CancelledError(
          absl::StrCat("interrupted by signal ", g_signal.load()));
    }
    if (NowNs() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "gave up after --timeout_s=", absl::GetFlag(FLAGS_timeout_s)));
    }
    return absl::OkStatus();
  };

  // 2. Per size: wait until every worker is parked at the gate (so the
  // previous size's job is over and the daemon is idle), measure the
  // reference, then open the gate for that size's job.
  absl::Status run_status;
  std::map<uint64_t, Reference> refs;
  {
    ThreadPool pool(ref_threads);
    auto arrive = [&]() -> absl::Status {
      absl::Status stop_reason;
      absl::Status st = gate->Arrive(std::chrono::seconds(3600), [&] {
        stop_reason = check_run();
        return !stop_reason.ok();
      });
      return stop_reason.ok() ? st : stop_reason;
    };
    for (uint64_t size : s.sizes) {
      run_status = arrive();  // every worker parked
      if (!run_status.ok()) break;
      run_status = check_run();
      if (!run_status.ok()) break;
      if (s.cuda) {
        // The device's own copy bandwidth, measured now, between sizes.
        absl::StatusOr<GpuReference> gpu =
            MeasureGpuReference(size, topo.trainers, s.iters);
        if (!gpu.ok()) {
          run_status = gpu.status();
          break;
        }
        refs[size] = Reference{gpu->bound_us, gpu->kernel_us};
      } else {
        refs[size] = MeasureReference(pool, size, topo.trainers, s.iters);
      }
      run_status = arrive();  // go
      if (!run_status.ok()) break;
    }
  }

  // 3. Wait for the workers to finish.
  while (run_status.ok() && finished < workers.size()) {
    run_status = check_run();
    if (run_status.ok() && finished < workers.size()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  for (Child& w : workers) w.Stop(SIGKILL, std::chrono::milliseconds(2000));

  // 4. Stop the daemon(s): SIGTERM must make them exit 0.
  for (size_t n = 0; n < daemons->children.size(); ++n) {
    const int st =
        daemons->children[n].Stop(SIGTERM, std::chrono::milliseconds(15000));
    if ((!WIFEXITED(st) || WEXITSTATUS(st) != 0) && run_status.ok()) {
      run_status = absl::InternalError(absl::StrCat(
          "gradd (node ", n, ") ", DescribeWaitStatus(st), " on SIGTERM"));
    }
  }
  if (!run_status.ok()) {
    dump_daemon_logs();
    return fail(run_status);
  }

  // 5. Results.
  absl::StatusOr<std::map<uint64_t, SizeResult>> results =
      CollectResults(s, outs);
  if (!results.ok()) return fail(results.status());
  if (!s.json) PrintHeader(s, topo, ref_threads);
  for (uint64_t size : s.sizes) {
    SizeResult& r = (*results)[size];
    r.ref = refs[size];
    ReadPhaseSplit(daemons->logs, JobId(job_prefix, size), &r);
    PrintRow(s, topo, r);
  }
  return 0;
}

}  // namespace
}  // namespace gradd::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "gradd-bench --trainers L --sizes 4KiB,64KiB,1MiB,25MiB,128MiB "
      "[--iters N] [--warmup N] [--format=json] [--gradd PATH] [--socket "
      "PATH] [--nodes N]\n\nMeasures gradd's ready->done time against a real "
      "daemon and L real trainer processes (see bench/README.md).");
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<gradd::bench::Settings> settings =
      gradd::bench::ReadSettings();
  if (!settings.ok()) {
    std::fprintf(stderr, "gradd-bench: %s\n",
                 settings.status().ToString().c_str());
    return 2;
  }
  const int worker = absl::GetFlag(FLAGS_worker);
  if (worker >= 0) return gradd::bench::WorkerMain(*settings, worker);
  return gradd::bench::CoordinatorMain(*settings);
}
