#include "server/engine/trace_json.h"

#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gradd {
namespace {

// Microseconds with three decimals, from integer nanoseconds: a double
// would lose the sub-microsecond digits of a Unix timestamp.
std::string Micros(int64_t ns) {
  const bool negative = ns < 0;
  const uint64_t v = negative ? -static_cast<uint64_t>(ns) : ns;
  return absl::StrFormat("%s%d.%03d", negative ? "-" : "", v / 1000, v % 1000);
}

void AppendMetadata(std::string* out, bool* first, absl::string_view what,
                    int pid, int tid, absl::string_view name) {
  absl::StrAppend(out, *first ? "\n" : ",\n", "{\"name\":\"", what,
                  "\",\"ph\":\"M\",\"pid\":", pid, ",\"tid\":", tid,
                  ",\"args\":{\"name\":", JsonString(name), "}}");
  *first = false;
}

}  // namespace

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

std::string ChromeTraceJson(absl::string_view job_id,
                            absl::Span<const TraceNode> nodes) {
  std::string out = "{\"traceEvents\":[";
  bool first = true;
  for (const TraceNode& node : nodes) {
    const int pid = node.node_rank;
    AppendMetadata(&out, &first, "process_name", pid, 0,
                   absl::StrCat("node ", node.node_id));
    std::set<int> tids;
    for (const TimelineEvent& e : node.events) tids.insert(e.local_rank + 1);
    tids.insert(0);
    for (int tid : tids) {
      AppendMetadata(&out, &first, "thread_name", pid, tid,
                     tid == 0 ? std::string("daemon (node phases)")
                              : absl::StrCat("local rank ", tid - 1));
    }
    for (const TimelineEvent& e : node.events) {
      absl::StrAppend(
          &out, ",\n{\"name\":", JsonString(e.phase),
          ",\"cat\":\"bucket\",\"ph\":\"X\",\"ts\":", Micros(e.start_unix_ns),
          ",\"dur\":", Micros(e.duration_ns), ",\"pid\":", pid,
          ",\"tid\":", e.local_rank + 1,
          ",\"args\":{\"iteration\":", e.iteration, ",\"bucket\":", e.bucket,
          "}}");
    }
  }
  absl::StrAppend(&out, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{",
                  "\"job_id\":", JsonString(job_id), "}}\n");
  return out;
}

std::string ChromeTraceJson(absl::string_view job_id,
                            const std::vector<TimelineEvent>& events,
                            absl::string_view node_id, int node_rank) {
  TraceNode node;
  node.node_id = std::string(node_id);
  node.node_rank = node_rank;
  node.events = events;
  return ChromeTraceJson(job_id, absl::MakeConstSpan(&node, 1));
}

}  // namespace gradd
