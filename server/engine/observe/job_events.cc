#include "server/engine/observe/job_events.h"

#include <chrono>

namespace gradd {
namespace {

int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t UnixNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int64_t EngineNowNs() { return SteadyNs(); }

absl::string_view ReformCauseName(ReformCause cause) {
  switch (cause) {
    case ReformCause::kNodeLost:
      return "node_lost";
    case ReformCause::kNodeAdmitted:
      return "node_admitted";
    case ReformCause::kRankRestarted:
      return "rank_restarted";
    case ReformCause::kOther:
      return "other";
    case ReformCause::kUnknown:
      break;
  }
  return "unknown";
}

int64_t EngineToUnixNs(int64_t engine_ns) {
  // Measured once: a wall-clock step later on (NTP) must not reorder the
  // events of a running job.
  static const int64_t offset = UnixNs() - SteadyNs();
  return engine_ns + offset;
}

std::unique_ptr<JobEventSinkInterface> EngineEventFanOut::OnJobStarted(
    const JobInfo& job) {
  auto fan_out = std::make_unique<JobEventFanOut>();
  for (EngineEventSinkInterface* s : sinks_) fan_out->Add(s->OnJobStarted(job));
  return fan_out;
}

}  // namespace gradd
