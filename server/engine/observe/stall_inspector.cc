#include "server/engine/observe/stall_inspector.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/logging.h"

namespace gradd {
namespace {

// Parameter names quoted in one message at most (a 25 MiB bucket of a large
// model holds hundreds); the report itself lists them all.
constexpr size_t kNamesInMessage = 8;

int64_t ThresholdNs(const StallInspector::Options& o) {
  int64_t ns = 0;
  for (const std::chrono::milliseconds t : {o.warning, o.shutdown}) {
    const int64_t v = std::chrono::nanoseconds(t).count();
    if (v > 0 && (ns == 0 || v < ns)) ns = v;
  }
  return ns;
}

std::string QuotedNames(const std::vector<std::string>& names) {
  std::vector<std::string> quoted;
  for (size_t i = 0; i < names.size() && i < kNamesInMessage; ++i) {
    quoted.push_back(absl::StrCat("'", names[i], "'"));
  }
  std::string out = absl::StrJoin(quoted, ", ");
  if (names.size() > kNamesInMessage) {
    absl::StrAppend(&out, " and ", names.size() - kNamesInMessage, " more");
  }
  return out;
}

}  // namespace

StallInspector::StallInspector(Options options)
    : options_(std::move(options)), threshold_ns_(ThresholdNs(options_)) {}

StallReport StallInspector::Report(int64_t now_ns, BucketWait wait,
                                   std::vector<std::string> params) const {
  StallReport r;
  r.job_id = options_.job_id;
  r.iteration = wait.iteration;
  r.bucket = wait.bucket;
  r.waited_seconds = (now_ns - wait.since_ns) / 1e9;
  std::string head =
      absl::StrFormat("job '%s': bucket %d of iteration %d has waited %.1f s",
                      r.job_id, r.bucket, r.iteration, r.waited_seconds);
  if (wait.in_network) {
    r.missing_nodes = options_.other_nodes;
    r.message = absl::StrCat(
        head,
        " in the inter-node allreduce: every local rank handed it over; "
        "waiting on the other nodes (",
        absl::StrJoin(r.missing_nodes, ", "),
        "), which of them has not sent it the collective does not tell; "
        "their daemons name their missing ranks");
  } else {
    r.missing_local_ranks = std::move(wait.missing_local_ranks);
    r.unready_parameters = std::move(params);
    r.message = absl::StrCat(
        head, ": local rank", r.missing_local_ranks.size() == 1 ? " " : "s ",
        absl::StrJoin(r.missing_local_ranks, ", "),
        r.missing_local_ranks.size() == 1 ? " has" : " have",
        " not handed it over; its parameters: ",
        QuotedNames(r.unready_parameters),
        " (the daemon sees when a bucket is complete, not which of its "
        "parameters are still missing)");
  }
  return r;
}

std::optional<std::string> StallInspector::Update(
    int64_t now_ns, std::vector<BucketWait> waits,
    absl::FunctionRef<std::vector<std::string>(int)> param_names,
    JobEventSinkInterface* sink) {
  const int64_t shutdown_ns =
      std::chrono::nanoseconds(options_.shutdown).count();
  std::vector<StallReport> stalled;
  std::optional<std::string> fail;
  for (BucketWait& w : waits) {
    const int64_t waited = now_ns - w.since_ns;
    if (threshold_ns_ == 0 || waited < threshold_ns_) continue;
    std::vector<std::string> params;
    if (!w.in_network) params = param_names(w.bucket);
    stalled.push_back(Report(now_ns, std::move(w), std::move(params)));
    const StallReport& r = stalled.back();
    const std::pair<uint64_t, int> key(r.iteration, r.bucket);
    if (std::find(reported_.begin(), reported_.end(), key) == reported_.end()) {
      reported_.push_back(key);
      spdlog::warn("stall: {}", r.message);
      if (sink != nullptr) sink->OnStall(r);
    }
    if (shutdown_ns > 0 && waited >= shutdown_ns && !fail.has_value()) {
      fail = absl::StrCat(r.message, "; stall_shutdown_ms (",
                          std::chrono::milliseconds(options_.shutdown).count(),
                          ") exceeded, failing the job");
    }
  }
  // Forget buckets that are no longer stalled (they moved on).
  reported_.erase(std::remove_if(reported_.begin(), reported_.end(),
                                 [&](const std::pair<uint64_t, int>& key) {
                                   return std::none_of(
                                       stalled.begin(), stalled.end(),
                                       [&](const StallReport& r) {
                                         return r.iteration == key.first &&
                                                r.bucket == key.second;
                                       });
                                 }),
                  reported_.end());
  absl::MutexLock lock(&mu_);
  current_ = std::move(stalled);
  return fail;
}

std::vector<StallReport> StallInspector::Current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

}  // namespace gradd
