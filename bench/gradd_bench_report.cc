// gradd-bench's results (gradd_bench.h): the workers' stamps turned into
// per-iteration times, the daemons' per-phase split read from their logs,
// and the output, nccl-tests style: a commented header and one row per size
// (--format=table), or one JSON object per size (--format=json).
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_support.h"
#include "bench/gradd_bench.h"

namespace gradd::bench {

namespace {

// Calls fn(line, at) for each line of the daemons' logs that contains `key`
// (at: where it starts).
template <typename Fn>
void ForEachLineWith(const std::vector<std::string>& logs,
                     const std::string& key, Fn fn) {
  for (const std::string& log : logs) {
    std::ifstream in(log);
    std::string line;
    while (std::getline(in, line)) {
      const size_t at = line.find(key);
      if (at != std::string::npos) fn(line, at);
    }
  }
}

}  // namespace

void ReadPhaseSplit(const std::vector<std::string>& logs,
                    const std::string& job_id, SizeResult* r) {
  const std::string key = absl::StrCat("job '", job_id, "' ended: ");
  double local = 0, network = 0, write_back = 0;
  int nodes = 0;
  ForEachLineWith(logs, key, [&](const std::string& line, size_t at) {
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
  });
  if (nodes == 0) return;
  r->local_reduce_us = local / nodes;
  r->network_us = network / nodes;
  r->write_back_us = write_back / nodes;
}

void ReadHookPhases(const std::vector<std::string>& logs, SizeResult* r) {
  const std::string key = absl::StrCat(
      " hook over ", r->size_bytes / sizeof(float), " bucket elements: ");
  const std::string per_run = "ms per run: ";
  std::vector<std::pair<std::string, double>> sum, min;
  int nodes = 0;
  ForEachLineWith(logs, key, [&](const std::string& line, size_t at) {
    const size_t from = line.find(per_run, at);
    if (from == std::string::npos) return;
    // "k=v k=v ... (" up to the parenthesis.
    const std::string fields = line.substr(
        from + per_run.size(), line.find(" (", from) - from - per_run.size());
    std::vector<std::pair<std::string, double>> node;
    for (absl::string_view f : absl::StrSplit(fields, ' ')) {
      const size_t eq = f.find('=');
      double v = 0;
      if (eq == absl::string_view::npos ||
          !absl::SimpleAtod(f.substr(eq + 1), &v)) {
        continue;
      }
      node.emplace_back(std::string(f.substr(0, eq)), v);
    }
    if (sum.empty()) {
      sum = node;
      min = node;
    } else if (sum.size() == node.size()) {
      for (size_t k = 0; k < node.size(); ++k) {
        sum[k].second += node[k].second;
        min[k].second = std::min(min[k].second, node[k].second);
      }
    } else {
      return;
    }
    ++nodes;
  });
  if (nodes == 0) return;
  for (auto& [name, v] : sum) v /= nodes;
  r->hook_ms = std::move(sum);
  r->hook_ms_min = std::move(min);
}

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

// "k<sep>v" pairs of a hook split joined by `between`, e.g. `"k": v, ...`.
std::string JoinSplit(const std::vector<std::pair<std::string, double>>& kv,
                      const char* quote, const char* sep, const char* between) {
  return absl::StrJoin(kv, between, [&](std::string* out, const auto& e) {
    absl::StrAppend(out, quote, e.first, quote, sep,
                    absl::StrFormat("%.3f", e.second));
  });
}

// `, "hook_ms": {"k": v, ...}, "hook_ms_min": {...}` when the hook's
// phases were found.
std::string HookJson(const SizeResult& r) {
  if (r.hook_ms.empty()) return "";
  return absl::StrCat(
      ", \"hook_ms\": {", JoinSplit(r.hook_ms, "\"", ": ", ", "),
      "}, \"hook_ms_min\": {", JoinSplit(r.hook_ms_min, "\"", ": ", ", "), "}");
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
        "\"device\": \"%s\"%s}\n",
        r.size_bytes, p50, p90, algbw, bound, busbw, r.ref.produced_us,
        r.ref.hot_us, bound_hot, min, mean, max, topo.trainers, topo.nodes,
        s.iters, s.warmup, r.local_reduce_us, r.network_us, r.write_back_us,
        s.cuda ? "cuda" : "cpu", HookJson(r).c_str());
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
    if (!r.hook_ms.empty()) {
      std::printf("# hook ms per run, mean of nodes: %s\n",
                  JoinSplit(r.hook_ms, "", "=", " ").c_str());
      std::printf("# hook ms per run, min of nodes:  %s\n",
                  JoinSplit(r.hook_ms_min, "", "=", " ").c_str());
    }
  }
  std::fflush(stdout);
}

}  // namespace gradd::bench
