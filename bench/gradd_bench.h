// gradd-bench's parts (gradd_bench.cc's header says what it measures and
// how):
//
//   gradd_bench.cc              the flags, Settings read from them, main():
//                               a hidden --worker process or the coordinator
//   gradd_bench_worker.cc       one trainer process: attach, fill, mark
//                               ready, wait, check the average, write stamps
//   gradd_bench_coordinator.cc  the daemon(s), the worker processes, the
//                               reference kernel, the run's supervision
//   gradd_bench_report.cc       stamps -> per-iteration times, the daemons'
//                               phase split, the table / JSON lines
//
// The flags are read once, in gradd_bench.cc (they are all defined there,
// so --help lists them together); the other parts take Settings.
#ifndef GRADD_BENCH_GRADD_BENCH_H_
#define GRADD_BENCH_GRADD_BENCH_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace gradd::bench {

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
  // --socket: the coordinator's external daemon; a worker's node daemon.
  std::string socket;
  // The coordinator's: the daemons it starts, the reference, the run.
  std::string gradd;
  std::string gradd_config;
  std::string node_exec;
  int rendezvous_port = 29600;
  int threads = 0;
  int timeout_s = 900;
  // A worker's (the internal flags the coordinator passes).
  std::string barrier;
  std::string gate;
  std::string out;
  std::string job_prefix;
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
  // A compressing hook's wall time per run and phase (PowerSGD: pass1,
  // allreduce_p, ...), in log order, averaged over the nodes, from the
  // line the hook logs when the job ends; empty when none was found.
  std::vector<std::pair<std::string, double>> hook_ms;
  // The same, least over the nodes: for the allreduce phases the node that
  // came last, so about the wire alone; mean - min is the waiting.
  std::vector<std::pair<std::string, double>> hook_ms_min;
};

// Where the daemons and trainers run. Single node today; the multi-node mode
// (issue 3) adds one daemon per node, the first serving rendezvous, and
// trainers of node n attaching to daemon n with node_rank n.
struct Topology {
  int nodes = 1;
  int trainers = 1;
  int world() const { return nodes * trainers; }
};

inline std::string JobId(const std::string& prefix, uint64_t size) {
  return absl::StrCat(prefix, "-", size);
}

// Value rank r writes in iteration i (the workers, and the reference's
// producers).
inline float FillValue(int rank, int iteration) {
  return static_cast<float>(rank + 1 + iteration % 8);
}

// gradd_bench_worker.cc: runs every size as trainer `rank`; the exit status.
int WorkerMain(const Settings& s, int rank);

// gradd_bench_coordinator.cc: the whole run; the exit status.
int CoordinatorMain(const Settings& s);

// gradd_bench_report.cc.
// Reads the workers' stamp files and turns them into per-iteration times.
absl::StatusOr<std::map<uint64_t, SizeResult>> CollectResults(
    const Settings& s, const std::vector<std::string>& outs);
// Fills r's phase split from the daemons' "job '<id>' ended: B buckets
// reduced; phase split ms: local_reduce=X network=Y write_back=Z" lines.
void ReadPhaseSplit(const std::vector<std::string>& logs,
                    const std::string& job_id, SizeResult* r);
// Fills r's hook_ms from the daemons' "<hook> hook over E bucket
// elements: R compressed runs, ms per run: k=v k=v ..." lines for a job of
// E = r->size_bytes / 4 float32 elements.
void ReadHookPhases(const std::vector<std::string>& logs, SizeResult* r);
// The table's comment lines and column heads (not printed for JSON).
void PrintHeader(const Settings& s, const Topology& topo, int ref_threads);
// One size: a table row or a JSON object, flushed.
void PrintRow(const Settings& s, const Topology& topo, const SizeResult& r);

}  // namespace gradd::bench

#endif  // GRADD_BENCH_GRADD_BENCH_H_
