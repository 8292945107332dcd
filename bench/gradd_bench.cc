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
//
// The parts: gradd_bench.h.
#include "bench/gradd_bench.h"

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_support.h"
#include "common/status_macros.h"

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

absl::StatusOr<Settings> ReadSettings() {
  Settings s;
  s.trainers = absl::GetFlag(FLAGS_trainers);
  s.nodes = absl::GetFlag(FLAGS_nodes);
  s.iters = absl::GetFlag(FLAGS_iters);
  s.warmup = absl::GetFlag(FLAGS_warmup);
  s.matrix_cols = absl::GetFlag(FLAGS_matrix_cols);
  s.tolerance = absl::GetFlag(FLAGS_tolerance);
  s.coordinator_host = absl::GetFlag(FLAGS_coordinator_host);
  s.socket = absl::GetFlag(FLAGS_socket);
  s.gradd = absl::GetFlag(FLAGS_gradd);
  s.gradd_config = absl::GetFlag(FLAGS_gradd_config);
  s.node_exec = absl::GetFlag(FLAGS_node_exec);
  s.rendezvous_port = absl::GetFlag(FLAGS_rendezvous_port);
  s.threads = absl::GetFlag(FLAGS_threads);
  s.timeout_s = absl::GetFlag(FLAGS_timeout_s);
  s.barrier = absl::GetFlag(FLAGS_barrier);
  s.gate = absl::GetFlag(FLAGS_gate);
  s.out = absl::GetFlag(FLAGS_out);
  s.job_prefix = absl::GetFlag(FLAGS_job_prefix);
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
