// Chrome trace event JSON (the format chrome://tracing and Perfetto's UI
// load) of job timelines (engine/timeline.h): one "X" (complete) event per
// TimelineEvent, ts and dur in microseconds since the Unix epoch, pid = the
// node (its node rank; a process_name metadata event names it), tid = 0 for
// the node's own phases and local rank + 1 for a rank's "ready" spans
// (thread_name metadata names them). Pure functions, any thread.
#ifndef GRADD_SERVER_ENGINE_TRACE_JSON_H_
#define GRADD_SERVER_ENGINE_TRACE_JSON_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/engine/job_events.h"

namespace gradd {

// One node's part of a job's trace.
struct TraceNode {
  std::string node_id;
  int node_rank = 0;
  std::vector<TimelineEvent> events;
};

// {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {"job_id":
// ...}}: the events of every node, each node a process.
std::string ChromeTraceJson(absl::string_view job_id,
                            absl::Span<const TraceNode> nodes);
// One node (node rank 0 unless given).
std::string ChromeTraceJson(absl::string_view job_id,
                            const std::vector<TimelineEvent>& events,
                            absl::string_view node_id = "this node",
                            int node_rank = 0);

// `s` as a JSON string literal, quotes included.
std::string JsonString(absl::string_view s);

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_TRACE_JSON_H_
