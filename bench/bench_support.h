// Small pieces gradd-bench is built from: size parsing and printing,
// percentiles, a cross-process barrier over a shared file mapping, child
// processes and a temporary directory. Nothing here knows about gradd's
// protocol; gradd_bench.cc wires them together.
//
// Thread-compatible: every object belongs to one thread at a time (the
// barrier is shared between processes, one thread each).
#ifndef GRADD_BENCH_BENCH_SUPPORT_H_
#define GRADD_BENCH_BENCH_SUPPORT_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/shm.h"

namespace gradd::bench {

// "4KiB", "64K", "1MiB", "25M", "2GiB", "1000", "1MB" (decimal) -> bytes.
// K/M/G and KiB/MiB/GiB are powers of 1024; KB/MB/GB powers of 1000.
absl::StatusOr<uint64_t> ParseSize(absl::string_view text);
// A comma-separated list of ParseSize sizes.
absl::StatusOr<std::vector<uint64_t>> ParseSizeList(absl::string_view text);
// 4096 -> "4KiB", 26214400 -> "25MiB", 1000 -> "1000B".
std::string FormatSize(uint64_t bytes);

// Nearest-rank percentile (p in [0, 100]) of `samples`; sorts a copy.
// 0 for an empty vector.
double Percentile(std::vector<double> samples, double p);

// Monotonic clock in nanoseconds (CLOCK_MONOTONIC: the same clock in every
// process on the machine, so stamps from different processes compare).
int64_t NowNs();

// A reusable sense-reversing barrier for `parties` processes, living in a
// small file every party maps (MAP_SHARED). Spins briefly, then sleeps on a
// futex. Arrive() fails with DEADLINE_EXCEEDED after `timeout` so a dead
// party never hangs the others forever.
class SharedBarrier {
 public:
  // Creates (truncates) the backing file. Call once, before the parties open.
  static absl::Status CreateFile(const std::string& path);
  static absl::StatusOr<SharedBarrier> Open(const std::string& path,
                                            uint32_t parties);
  SharedBarrier(SharedBarrier&& other) noexcept;
  SharedBarrier& operator=(SharedBarrier&&) = delete;
  SharedBarrier(const SharedBarrier&) = delete;
  ~SharedBarrier();

  // `stop` (optional) is polled while sleeping (every ~10 ms); when it
  // returns true Arrive gives up with CANCELLED. After a failed Arrive the
  // barrier is broken for every party. `party` (0 .. parties - 1, distinct
  // per party; -1: anonymous) lets a waiter stop spinning when a party
  // that has not arrived last ran on its CPU (the spin would hold the core
  // that party needs to arrive; the daemon's waits do the same, see
  // ControlHeader::stand_down_cpu).
  absl::Status Arrive(std::chrono::milliseconds timeout,
                      const std::function<bool()>& stop = nullptr,
                      int party = -1);

 private:
  struct State;
  SharedBarrier(Mapping mapping, uint32_t parties);
  Mapping mapping_;  // owns the shared page; state_ points into it
  State* state_;
  uint32_t parties_;
};

// A child process: fork + exec, killed (SIGKILL) and reaped on destruction
// unless it was waited for. The child gets PR_SET_PDEATHSIG=SIGKILL (SIGTERM
// for daemons), so nothing outlives a bench that is killed itself.
class Child {
 public:
  struct Options {
    // Redirect stdout and stderr to this file (append); empty: inherit.
    std::string output_file;
    int death_signal = 9;  // SIGKILL
  };
  static absl::StatusOr<Child> Spawn(const std::vector<std::string>& argv,
                                     const Options& options);
  Child(Child&& other) noexcept;
  Child& operator=(Child&& other) noexcept;
  Child(const Child&) = delete;
  ~Child();

  pid_t pid() const { return pid_; }
  // Non-blocking: the wait status once the child has exited.
  std::optional<int> Poll();
  // Sends `signal`, then waits up to `timeout`; SIGKILL after that. Returns
  // the wait status.
  int Stop(int signal, std::chrono::milliseconds timeout);

 private:
  explicit Child(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// "exited with status 1", "killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int status);

// mkdtemp under $TMPDIR (or /tmp); removed recursively on destruction.
class TempDir {
 public:
  static absl::StatusOr<TempDir> Create(absl::string_view prefix);
  TempDir(TempDir&& other) noexcept : path_(std::move(other.path_)) {
    other.path_.clear();
  }
  TempDir(const TempDir&) = delete;
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// Waits until `path` is a socket, `child` exited, or `timeout` passed.
absl::Status WaitForSocket(const std::string& path, Child* child,
                           std::chrono::milliseconds timeout);

// The directory of the running executable (/proc/self/exe).
std::string SelfDir();
std::string SelfExe();

}  // namespace gradd::bench

#endif  // GRADD_BENCH_BENCH_SUPPORT_H_
