// gradd-bench's coordinator (gradd_bench.h): starts the daemon(s) (or uses
// --socket's), re-executes this binary as one hidden --worker process per
// global rank, measures each size's reference kernel while the workers wait
// at the gate (the daemons idle), watches the run (a failed worker, a dead
// daemon, a signal or --timeout_s stops everything and cleans up), stops the
// daemons and prints the results (gradd_bench_report.cc).
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "bench/bench_support.h"
#include "bench/gpu_bench.h"
#include "bench/gradd_bench.h"
#include "common/dtype.h"
#include "common/reduce.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"

namespace gradd::bench {
namespace {

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

// --- Daemons --------------------------------------------------------------

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

absl::StatusOr<Daemons> StartDaemons(const Settings& s, const Topology& topo,
                                     const std::string& dir) {
  Daemons d;
  const std::string& external = s.socket;
  if (!external.empty()) {
    if (topo.nodes > 1) {
      return absl::InvalidArgumentError(
          "--socket (an external daemon) is for --nodes 1 only");
    }
    d.sockets.push_back(external);
    return d;
  }
  std::string gradd = s.gradd;
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
    if (!s.gradd_config.empty()) {
      argv.insert(argv.end(), {"--config", s.gradd_config});
    }
    if (!s.node_exec.empty()) {
      std::vector<std::string> wrapped = absl::StrSplit(
          absl::StrReplaceAll(s.node_exec, {{"{node}", absl::StrCat(n)}}), ' ',
          absl::SkipEmpty());
      argv.insert(argv.begin(), wrapped.begin(), wrapped.end());
    }
    if (topo.nodes > 1) {
      argv.insert(argv.end(), {"--rendezvous-token-file", token_file});
    }
    if (topo.nodes > 1 && !s.coordinator_host.empty()) {
      // Discovery: the daemon on the coordinator host serves on demand.
      argv.insert(argv.end(),
                  {"--node-id", absl::StrCat("bench-node", n),
                   "--rendezvous-port", absl::StrCat(s.rendezvous_port)});
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
    if (topo.nodes > 1 && n == 0 && s.coordinator_host.empty()) {
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

// The end of a daemon's log, shown when the run fails.
std::string Tail(const std::string& path, size_t max_bytes = 4000) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  if (text.size() > max_bytes) text = text.substr(text.size() - max_bytes);
  return text;
}

}  // namespace

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
  int ref_threads = s.threads;
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
  absl::StatusOr<Daemons> daemons = StartDaemons(s, topo, dir->path());
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
  const int64_t deadline = NowNs() + int64_t{s.timeout_s} * 1000000000;
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
      return absl::DeadlineExceededError(
          absl::StrCat("gave up after --timeout_s=", s.timeout_s));
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
    ReadHookPhases(daemons->logs, &r);
    PrintRow(s, topo, r);
  }
  return 0;
}

}  // namespace gradd::bench
