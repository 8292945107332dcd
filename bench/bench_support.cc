#include "bench/bench_support.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/doorbell.h"
#include "common/shm.h"

namespace gradd::bench {
namespace {

absl::Status ErrnoError(absl::string_view what) {
  const int err = errno;
  return absl::InternalError(absl::StrCat(what, ": ", strerror(err)));
}

}  // namespace

absl::StatusOr<uint64_t> ParseSize(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < s.size() &&
         (absl::ascii_isdigit(s[digits]) || s[digits] == '.')) {
    ++digits;
  }
  double number;
  if (digits == 0 || !absl::SimpleAtod(s.substr(0, digits), &number)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a size (e.g. 4KiB, 25MiB, 1000)"));
  }
  const std::string unit = absl::AsciiStrToLower(s.substr(digits));
  double scale;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "k" || unit == "kib") {
    scale = 1024.0;
  } else if (unit == "m" || unit == "mib") {
    scale = 1024.0 * 1024;
  } else if (unit == "g" || unit == "gib") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "kb") {
    scale = 1e3;
  } else if (unit == "mb") {
    scale = 1e6;
  } else if (unit == "gb") {
    scale = 1e9;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "': unknown unit '", s.substr(digits),
                     "' (use B, KiB, MiB, GiB, K, M, G, KB, MB, GB)"));
  }
  const double bytes = std::round(number * scale);
  if (bytes < 1 || bytes > 1e15) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is out of range"));
  }
  return static_cast<uint64_t>(bytes);
}

absl::StatusOr<std::vector<uint64_t>> ParseSizeList(absl::string_view text) {
  std::vector<uint64_t> sizes;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    absl::StatusOr<uint64_t> size = ParseSize(part);
    if (!size.ok()) return size.status();
    sizes.push_back(*size);
  }
  if (sizes.empty()) {
    return absl::InvalidArgumentError("no sizes given");
  }
  return sizes;
}

std::string FormatSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  uint64_t v = bytes;
  while (unit < 4 && v >= 1024 && v % 1024 == 0) {
    v /= 1024;
    ++unit;
  }
  return absl::StrCat(v, kUnits[unit]);
}

double Percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const double rank = std::ceil(p / 100.0 * samples.size());
  const size_t index = std::clamp<size_t>(
      rank < 1 ? 0 : static_cast<size_t>(rank) - 1, 0, samples.size() - 1);
  return samples[index];
}

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// --- SharedBarrier ----------------------------------------------------------

struct SharedBarrier::State {
  static constexpr int kMaxParties = 64;  // named ones; more are anonymous
  alignas(64) std::atomic<uint32_t> arrived;
  alignas(64) std::atomic<uint32_t> generation;
  // Per named party: 1 + the generation it last arrived in, 1 + the CPU
  // it arrived from (doorbell_internal::CpuHint).
  alignas(64) std::atomic<uint32_t> arrived_in[kMaxParties];
  std::atomic<uint32_t> cpu[kMaxParties];
};
// (CreateFile makes the backing file one 4 KiB page; State fits in it.)

absl::Status SharedBarrier::CreateFile(const std::string& path) {
  const int fd =
      open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(absl::StrCat("create ", path));
  const int rc = ftruncate(fd, 4096);  // zero-filled: arrived = generation = 0
  close(fd);
  if (rc != 0) return ErrnoError(absl::StrCat("ftruncate ", path));
  return absl::OkStatus();
}

absl::StatusOr<SharedBarrier> SharedBarrier::Open(const std::string& path,
                                                  uint32_t parties) {
  static_assert(sizeof(State) <= 4096);
  UniqueFd fd(open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError(absl::StrCat("open ", path));
  absl::StatusOr<Mapping> mapping = Mapping::Map(fd.get(), 4096);
  if (!mapping.ok()) return mapping.status();
  return SharedBarrier(*std::move(mapping), parties);
}

SharedBarrier::SharedBarrier(Mapping mapping, uint32_t parties)
    : mapping_(std::move(mapping)),
      state_(static_cast<State*>(mapping_.data())),
      parties_(parties) {}

SharedBarrier::SharedBarrier(SharedBarrier&& other) noexcept = default;
SharedBarrier::~SharedBarrier() = default;

absl::Status SharedBarrier::Arrive(std::chrono::milliseconds timeout,
                                   const std::function<bool()>& stop,
                                   int party) {
  const uint32_t gen = state_->generation.load(std::memory_order_acquire);
  const bool named = party >= 0 && party < State::kMaxParties &&
                     static_cast<uint32_t>(party) < parties_;
  const uint32_t my_cpu = doorbell_internal::CpuHint();
  if (named) {
    state_->cpu[party].store(my_cpu, std::memory_order_relaxed);
    state_->arrived_in[party].store(gen + 1, std::memory_order_relaxed);
  }
  // Whether a named party that has not arrived yet last ran here.
  auto late_party_here = [&] {
    if (!named || my_cpu == 0) return false;
    const uint32_t n = std::min<uint32_t>(parties_, State::kMaxParties);
    for (uint32_t q = 0; q < n; ++q) {
      if (state_->arrived_in[q].load(std::memory_order_relaxed) != gen + 1 &&
          state_->cpu[q].load(std::memory_order_relaxed) == my_cpu) {
        return true;
      }
    }
    return false;
  };
  if (state_->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == parties_) {
    state_->arrived.store(0, std::memory_order_relaxed);
    state_->generation.fetch_add(1, std::memory_order_release);
    FutexWakeAll(&state_->generation);
    return absl::OkStatus();
  }
  // Spin long enough to catch a party that is a few microseconds behind,
  // short enough not to steal a core from the daemon on a small machine.
  int64_t spin_until = NowNs() + 20000;
  const int64_t deadline = NowNs() + std::chrono::nanoseconds(timeout).count();
  while (state_->generation.load(std::memory_order_acquire) == gen) {
    const int64_t now = NowNs();
    if (now <= spin_until && late_party_here()) spin_until = now - 1;
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("barrier: not all ", parties_,
                       " parties arrived within ", timeout.count(), " ms"));
    }
    if (now > spin_until) {
      if (stop && stop()) {
        return absl::CancelledError("barrier: stopped while waiting");
      }
      FutexWait(&state_->generation, gen, std::chrono::milliseconds(10));
    }
  }
  return absl::OkStatus();
}

// --- Child ------------------------------------------------------------------

absl::StatusOr<Child> Child::Spawn(const std::vector<std::string>& argv,
                                   const Options& options) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int out_fd = -1;
  if (!options.output_file.empty()) {
    out_fd = open(options.output_file.c_str(),
                  O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (out_fd < 0)
      return ErrnoError(absl::StrCat("open ", options.output_file));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    if (out_fd >= 0) close(out_fd);
    return ErrnoError("fork");
  }
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    prctl(PR_SET_PDEATHSIG, options.death_signal);
    if (getppid() != parent) _exit(127);
    if (out_fd >= 0) {
      dup2(out_fd, STDOUT_FILENO);
      dup2(out_fd, STDERR_FILENO);
    }
    execv(args[0], args.data());
    const char msg[] = "gradd-bench: exec failed\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(127);
  }
  if (out_fd >= 0) close(out_fd);
  return Child(pid);
}

Child::Child(Child&& other) noexcept
    : pid_(other.pid_), status_(other.status_) {
  other.pid_ = -1;
}

Child& Child::operator=(Child&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && !status_) Stop(SIGKILL, std::chrono::milliseconds(1000));
    pid_ = other.pid_;
    status_ = other.status_;
    other.pid_ = -1;
  }
  return *this;
}

Child::~Child() {
  if (pid_ > 0 && !status_) Stop(SIGKILL, std::chrono::milliseconds(1000));
}

std::optional<int> Child::Poll() {
  if (status_ || pid_ <= 0) return status_;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) status_ = status;
  return status_;
}

int Child::Stop(int signal, std::chrono::milliseconds timeout) {
  if (Poll()) return *status_;
  kill(pid_, signal);
  const int64_t deadline = NowNs() + std::chrono::nanoseconds(timeout).count();
  while (NowNs() < deadline) {
    if (Poll()) return *status_;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  status_ = status;
  return status;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) {
    return absl::StrCat("exited with status ", WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("wait status ", status);
}

// --- TempDir ----------------------------------------------------------------

absl::StatusOr<TempDir> TempDir::Create(absl::string_view prefix) {
  const char* tmp = getenv("TMPDIR");
  std::string templ = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp", "/",
                                   prefix, ".XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) {
    return ErrnoError(absl::StrCat("mkdtemp ", templ));
  }
  return TempDir(std::move(templ));
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

absl::Status WaitForSocket(const std::string& path, Child* child,
                           std::chrono::milliseconds timeout) {
  const int64_t deadline = NowNs() + std::chrono::nanoseconds(timeout).count();
  while (true) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
      return absl::OkStatus();
    }
    if (child != nullptr) {
      if (std::optional<int> status = child->Poll()) {
        return absl::UnavailableError(
            absl::StrCat("the daemon ", DescribeWaitStatus(*status),
                         " before its socket ", path, " appeared"));
      }
    }
    if (NowNs() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no socket at ", path, " after ", timeout.count(), " ms"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string SelfExe() {
  std::error_code ec;
  std::filesystem::path exe =
      std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.string();
}

std::string SelfDir() {
  return std::filesystem::path(SelfExe()).parent_path().string();
}

}  // namespace gradd::bench
