// gradd-collective-bench: latency and bandwidth of the daemon's collectives
// of arbitrary data (Client::Allreduce, gradd/collectives.h) between real
// trainer processes on one node, as a torch.distributed process group
// backed by gradd would issue them.
//
//   gradd-collective-bench --trainers 2 --sizes 4KiB,1MiB,16MiB --iters 50
//
// Starts its own daemon (../server/gradd next to this binary, or --gradd)
// on a socket in a temporary directory unless --socket names a running
// one, forks --trainers processes that attach one collective-only job, and
// has each allreduce (sum, float32) every size --warmup + --iters times;
// every result is checked. Local rank 0 prints, per size: the median and
// 99th percentile time of one Allreduce call and the algorithm bandwidth
// (bytes / median time). Collectives larger than the collective area
// (--collective_bytes, 0 = the client's default) take several rounds.
//
// --format=json prints instead one object per size (after all ranks are
// done), timed across the ranks as gradd-bench times a bucket: every rank
// stamps CLOCK_MONOTONIC right before and after each call (the barrier
// before it is not timed), and an iteration's time is the last rank's end
// minus the last rank's start. bench/compare_torch.py --collective reads it.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_support.h"
#include "gradd/client.h"

ABSL_FLAG(int, trainers, 2, "Local trainer processes (ranks).");
ABSL_FLAG(std::string, sizes, "4KiB,256KiB,4MiB,32MiB",
          "Allreduce sizes (bytes of float32), comma-separated.");
ABSL_FLAG(int, iters, 50, "Timed calls per size.");
ABSL_FLAG(int, warmup, 5, "Untimed calls per size.");
ABSL_FLAG(uint64_t, collective_bytes, 0,
          "Collective area per rank (0: the client's default, 4 MiB).");
ABSL_FLAG(std::string, gradd, "",
          "The daemon binary (default ../server/gradd).");
ABSL_FLAG(std::string, socket, "",
          "A running daemon's socket (empty: start one).");
ABSL_FLAG(std::string, format, "table", "Output: table (human) or json.");

namespace gradd::bench {
namespace {

// Index of rank `rank`'s (start, end) stamp pair of timed iteration `it` of
// size number `size_index` in the stamps area shared by all ranks.
size_t StampIndex(size_t size_index, int it, int rank, int world) {
  const size_t iters = absl::GetFlag(FLAGS_iters);
  return ((size_index * iters + it) * world + rank) * 2;
}

// One trainer process; returns its exit code. Writes its timed calls'
// start and end stamps into `stamps` (shared with the parent).
int RunRank(const std::string& socket, int rank, int world,
            const std::vector<uint64_t>& sizes, bool json, int64_t* stamps) {
  ClientOptions options;
  options.socket_path = socket;
  options.job_id = "collective-bench";
  options.local_rank = rank;
  options.local_world_size = world;
  options.collective_bytes = absl::GetFlag(FLAGS_collective_bytes);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Attach(options, {});
  if (!client.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank,
                 std::string(client.status().message()).c_str());
    return 3;
  }
  Client& c = **client;
  if (rank == 0 && !json) {
    std::printf("%-10s %12s %12s %12s   (%d ranks, allreduce sum float32)\n",
                "size", "p50 us", "p99 us", "algbw GB/s", world);
  }
  const double sum_of_ranks = world * (world + 1) / 2.0;
  for (size_t size_index = 0; size_index < sizes.size(); ++size_index) {
    const uint64_t bytes = sizes[size_index];
    const size_t count = bytes / sizeof(float);
    std::vector<float> data(count);
    std::vector<double> samples;
    for (int it = 0;
         it < absl::GetFlag(FLAGS_warmup) + absl::GetFlag(FLAGS_iters); ++it) {
      for (size_t i = 0; i < count; ++i) {
        data[i] = static_cast<float>((rank + 1) * (i % 5));
      }
      if (absl::Status s = c.Barrier(); !s.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank,
                     std::string(s.message()).c_str());
        return 3;
      }
      const int64_t start = NowNs();
      absl::Status s =
          c.Allreduce(data.data(), count, dtype::kFloat32, ReduceOp::kSum);
      const int64_t end = NowNs();
      const int64_t ns = end - start;
      if (!s.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank,
                     std::string(s.message()).c_str());
        return 3;
      }
      for (size_t i = 0; i < count; ++i) {
        if (data[i] != static_cast<float>(sum_of_ranks * (i % 5))) {
          std::fprintf(stderr, "rank %d: wrong sum at element %zu\n", rank, i);
          return 4;
        }
      }
      if (it >= absl::GetFlag(FLAGS_warmup)) {
        samples.push_back(ns / 1e3);
        const size_t at = StampIndex(
            size_index, it - absl::GetFlag(FLAGS_warmup), rank, world);
        stamps[at] = start;
        stamps[at + 1] = end;
      }
    }
    if (rank == 0 && !json) {
      const double p50 = Percentile(samples, 50);
      std::printf("%-10s %12.1f %12.1f %12.3f\n", FormatSize(bytes).c_str(),
                  p50, Percentile(samples, 99),
                  p50 > 0 ? bytes / (p50 * 1e3) : 0.0);
      std::fflush(stdout);
    }
  }
  return 0;
}

// --format=json: one object per size from the ranks' stamps.
void PrintJson(const std::vector<uint64_t>& sizes, int world,
               const int64_t* stamps) {
  const int iters = absl::GetFlag(FLAGS_iters);
  for (size_t size_index = 0; size_index < sizes.size(); ++size_index) {
    std::vector<double> times;  // last start -> last end, us
    std::vector<double> rank0;  // rank 0's own call, us
    for (int it = 0; it < iters; ++it) {
      int64_t last_start = INT64_MIN;
      int64_t last_end = INT64_MIN;
      for (int r = 0; r < world; ++r) {
        const size_t at = StampIndex(size_index, it, r, world);
        last_start = std::max(last_start, stamps[at]);
        last_end = std::max(last_end, stamps[at + 1]);
        if (r == 0) rank0.push_back((stamps[at + 1] - stamps[at]) / 1e3);
      }
      times.push_back((last_end - last_start) / 1e3);
    }
    double sum = 0;
    for (double t : times) sum += t;
    const double p50 = Percentile(times, 50);
    std::printf(
        "{\"size_bytes\": %llu, \"p50_us\": %.3f, \"p90_us\": %.3f, "
        "\"p99_us\": %.3f, \"mean_us\": %.3f, \"min_us\": %.3f, "
        "\"max_us\": %.3f, \"algbw_gbps\": %.4f, "
        "\"rank0_call_p50_us\": %.3f, \"rank0_call_p99_us\": %.3f, "
        "\"trainers\": %d, \"iters\": %d, \"warmup\": %d, "
        "\"op\": \"sum\", \"dtype\": \"float32\"}\n",
        static_cast<unsigned long long>(sizes[size_index]), p50,
        Percentile(times, 90), Percentile(times, 99),
        times.empty() ? 0.0 : sum / times.size(), Percentile(times, 0),
        Percentile(times, 100), p50 > 0 ? sizes[size_index] / (p50 * 1e3) : 0.0,
        Percentile(rank0, 50), Percentile(rank0, 99), world, iters,
        absl::GetFlag(FLAGS_warmup));
  }
  std::fflush(stdout);
}

int Main() {
  absl::StatusOr<std::vector<uint64_t>> sizes =
      ParseSizeList(absl::GetFlag(FLAGS_sizes));
  const int world = absl::GetFlag(FLAGS_trainers);
  if (!sizes.ok() || world < 1) {
    std::fprintf(stderr, "bad --sizes or --trainers\n");
    return 2;
  }
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "table" && format != "json") {
    std::fprintf(stderr, "--format=%s: use table or json\n", format.c_str());
    return 2;
  }
  const bool json = format == "json";
  if (absl::GetFlag(FLAGS_iters) < 0 || absl::GetFlag(FLAGS_warmup) < 0) {
    std::fprintf(stderr, "--iters and --warmup must be >= 0\n");
    return 2;
  }
  // Every rank's (start, end) stamps of every timed call, shared with the
  // forked ranks.
  const size_t stamp_bytes =
      std::max<size_t>(1, sizes->size() * absl::GetFlag(FLAGS_iters) * world *
                              2 * sizeof(int64_t));
  void* area = mmap(nullptr, stamp_bytes, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (area == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  int64_t* const stamps = static_cast<int64_t*>(area);
  std::optional<TempDir> dir;
  std::optional<Child> daemon;
  std::string socket = absl::GetFlag(FLAGS_socket);
  if (socket.empty()) {
    absl::StatusOr<TempDir> d = TempDir::Create("gradd-collbench-");
    if (!d.ok()) {
      std::fprintf(stderr, "%s\n", std::string(d.status().message()).c_str());
      return 1;
    }
    dir.emplace(*std::move(d));
    socket = dir->path() + "/gradd.sock";
    std::string binary = absl::GetFlag(FLAGS_gradd);
    if (binary.empty()) binary = SelfDir() + "/../server/gradd";
    Child::Options o;
    o.output_file = dir->path() + "/gradd.log";
    o.death_signal = 15;
    absl::StatusOr<Child> child = Child::Spawn({binary, "--socket", socket}, o);
    absl::Status up = child.status();
    for (const std::string& path : {socket, socket + ".session"}) {
      if (up.ok()) up = WaitForSocket(path, &*child, std::chrono::seconds(30));
    }
    if (!up.ok()) {
      std::fprintf(stderr, "starting %s: %s\n", binary.c_str(),
                   std::string(up.message()).c_str());
      return 1;
    }
    daemon.emplace(*std::move(child));
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) _exit(RunRank(socket, r, world, *sizes, json, stamps));
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "trainer %d %s\n", static_cast<int>(pid),
                   DescribeWaitStatus(status).c_str());
      ++failed;
    }
  }
  if (daemon.has_value()) daemon->Stop(15, std::chrono::seconds(10));
  if (failed == 0 && json) PrintJson(*sizes, world, stamps);
  munmap(area, stamp_bytes);
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace gradd::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gradd::bench::Main();
}
