#include "tools/graddctl/trace.h"

#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gradd::ctl {
namespace {

// Microseconds with the nanoseconds kept (three decimals).
std::string Micros(int64_t ns) {
  const bool negative = ns < 0;
  const uint64_t a = negative ? -static_cast<uint64_t>(ns) : ns;
  return absl::StrFormat("%s%d.%03d", negative ? "-" : "", a / 1000, a % 1000);
}

int Tid(int local_rank) { return local_rank < 0 ? 0 : local_rank + 1; }

std::string Metadata(const char* what, int pid, int tid,
                     const std::string& name) {
  return absl::StrCat("{\"ph\":\"M\",\"name\":\"", what, "\",\"pid\":", pid,
                      ",\"tid\":", tid,
                      ",\"args\":{\"name\":", JsonString(name), "}}");
}

}  // namespace

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
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
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        // Control characters and anything outside ASCII escaped, so the
        // result is valid JSON whatever bytes a name holds.
        if (c < 0x20 || c >= 0x7f) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += "\"";
  return out;
}

std::string ChromeTraceJson(const v1::GetTraceResponse& trace) {
  const int pid = trace.node_rank();
  std::string out = "{\"traceEvents\":[\n";
  out += Metadata(
      "process_name", pid, 0,
      absl::StrCat("gradd ", trace.node_id().empty() ? std::string("node")
                                                     : trace.node_id()));
  std::set<int> tids = {0};
  for (const v1::TraceEvent& e : trace.events())
    tids.insert(Tid(e.local_rank()));
  for (int tid : tids) {
    out += ",\n";
    out += Metadata(
        "thread_name", pid, tid,
        tid == 0 ? std::string("node") : absl::StrCat("rank ", tid - 1));
  }
  for (const v1::TraceEvent& e : trace.events()) {
    out += ",\n";
    absl::StrAppend(
        &out, "{\"ph\":\"X\",\"name\":",
        // Rank restart events belong to no bucket (-1).
        JsonString(e.bucket() < 0 ? e.phase()
                                  : absl::StrCat(e.phase(), " b", e.bucket())),
        ",\"cat\":", JsonString(e.phase()), ",\"pid\":", pid,
        ",\"tid\":", Tid(e.local_rank()), ",\"ts\":", Micros(e.start_unix_ns()),
        ",\"dur\":", Micros(e.duration_ns()),
        ",\"args\":{\"iteration\":", e.iteration(), ",\"bucket\":", e.bucket(),
        ",\"local_rank\":", e.local_rank(), "}}");
  }
  absl::StrAppend(&out, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{",
                  "\"job_id\":", JsonString(trace.job_id()),
                  ",\"node_id\":", JsonString(trace.node_id()),
                  ",\"node_rank\":", trace.node_rank(),
                  ",\"events\":", trace.events_size(),
                  ",\"note\":", JsonString(trace.note()), "}}\n");
  return out;
}

}  // namespace gradd::ctl
