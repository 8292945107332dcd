// graddctl's output: human tables (the default) and JSON (--json, the
// protos' JSON mapping with proto field names and every field present).
// Pure functions of the daemon's answers.
#ifndef GRADD_TOOLS_GRADDCTL_FORMAT_H_
#define GRADD_TOOLS_GRADDCTL_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "google/protobuf/message.h"
#include "gradd/v1/admin.pb.h"
#include "grpc/health/v1/health.pb.h"

namespace gradd::ctl {

// Columns padded to their widest cell, two spaces apart, `indent` spaces
// before each line; every line ends in '\n'. Rows shorter than the header
// are padded with empty cells.
std::string Table(const std::vector<std::string>& header,
                  const std::vector<std::vector<std::string>>& rows,
                  int indent = 0);

// 1536 -> "1.5 KiB"; below 1 KiB in bytes ("512 B").
std::string HumanBytes(uint64_t bytes);
// Nanoseconds: "850 ns", "12.3 us", "4.56 ms", "2.50 s", "3h02m05s" from an
// hour up (and "1d03h" from a day).
std::string HumanDuration(int64_t ns);

// The message as one JSON object (proto field names, defaults included).
std::string ToJson(const google::protobuf::Message& message);

std::string FormatStatus(const v1::GetStatusResponse& status);
std::string FormatJobs(const v1::ListJobsResponse& jobs);
std::string FormatJob(const v1::JobDetail& job);
// "bucket cap: 10.0 MiB (auto, settled after iteration 21); step times:
// ..." for a job whose cap the daemon tunes (JobSummary.autotune).
std::string FormatAutotune(const v1::BucketAutotune& autotune);
std::string FormatHealth(
    grpc::health::v1::HealthCheckResponse::ServingStatus status);
// "running", "pending", ... for a JobState.
std::string StateName(v1::JobState state);

}  // namespace gradd::ctl

#endif  // GRADD_TOOLS_GRADDCTL_FORMAT_H_
