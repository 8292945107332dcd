// A job's timeline (Admin.GetTrace) as a Chrome trace / Perfetto JSON
// object: one complete event (ph "X") per timeline event, named
// "<phase> b<bucket>", ts / dur in microseconds; pid = the node rank (the
// process named after the node id), tid 0 = the node's own work
// (local_rank -1, named "node"), tid r + 1 = local rank r (named
// "rank r"). The daemon's note, job and node go into "otherData". An empty
// timeline gives a valid trace with only the naming metadata.
#ifndef GRADD_TOOLS_GRADDCTL_TRACE_H_
#define GRADD_TOOLS_GRADDCTL_TRACE_H_

#include <string>
#include <string_view>

#include "gradd/v1/admin.pb.h"

namespace gradd::ctl {

std::string ChromeTraceJson(const v1::GetTraceResponse& trace);

// `s` as a JSON string literal (quotes included; control characters and
// non-UTF-8 bytes escaped as \u00XX).
std::string JsonString(std::string_view s);

}  // namespace gradd::ctl

#endif  // GRADD_TOOLS_GRADDCTL_TRACE_H_
