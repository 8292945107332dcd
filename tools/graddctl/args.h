// graddctl's command line and exit codes.
//
//   graddctl [--socket PATH] [--json] [--timeout DURATION] COMMAND [ARGS]
//     status                     daemon version, uptime, node, jobs, sessions
//     jobs                       one line per job
//     job ID                     one job: ranks, nodes, plan, timings, ...
//     health [--service NAME]    grpc.health.v1 Check ("" = the daemon)
//     config                     the daemon's effective config
//     trace JOB --out FILE       the job's timeline as Chrome trace JSON
//
// Flags may come before or after the command. --socket defaults to
// $GRADD_SOCKET, else the daemon's default path (common/session.h);
// --timeout (default 5s) bounds the whole call ("500ms", "2s", or seconds).
#ifndef GRADD_TOOLS_GRADDCTL_ARGS_H_
#define GRADD_TOOLS_GRADDCTL_ARGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/support/status.h"

namespace gradd::ctl {

// What a script can rely on.
enum ExitCode : int {
  kExitOk = 0,
  // The daemon answered with an error (e.g. no such job), health is not
  // SERVING, or the result could not be written (--out).
  kExitError = 1,
  kExitUsage = 2,
  // No answer: nothing listens on the socket, the call timed out, or the
  // daemon is unavailable (stopping, or its control loop hung).
  kExitUnreachable = 3,
};

enum class Command { kHelp, kStatus, kJobs, kJob, kHealth, kConfig, kTrace };

struct Options {
  Command command = Command::kHelp;
  std::string socket;
  bool json = false;
  absl::Duration timeout = absl::Seconds(5);
  std::string job_id;   // job, trace
  std::string out;      // trace: "-" is stdout
  std::string service;  // health
};

// INVALID_ARGUMENT naming what is wrong (unknown command or flag, missing
// or extra argument, bad duration). `default_socket` is used without
// --socket.
absl::StatusOr<Options> ParseArgs(const std::vector<std::string>& args,
                                  const std::string& default_socket);

std::string Usage();

// The exit code for a failed call.
int ExitCodeFor(const grpc::Status& status);

}  // namespace gradd::ctl

#endif  // GRADD_TOOLS_GRADDCTL_ARGS_H_
