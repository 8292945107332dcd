#include "tools/graddctl/args.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace gradd::ctl {
namespace {

absl::StatusOr<absl::Duration> ParseTimeout(const std::string& text) {
  absl::Duration d;
  double seconds = 0;
  if (absl::SimpleAtod(text, &seconds)) {
    d = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(text, &d)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--timeout '", text, "' is not a duration (e.g. 500ms, 2s, 1.5)"));
  }
  if (d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout '", text, "' must be positive and finite"));
  }
  return d;
}

}  // namespace

std::string Usage() {
  return "usage: graddctl [--socket PATH] [--json] [--timeout DURATION] "
         "COMMAND [ARGS]\n"
         "commands:\n"
         "  status                    daemon version, uptime, node, jobs, "
         "sessions\n"
         "  jobs                      the daemon's jobs, one per line\n"
         "  job ID                    one job: ranks, nodes, plan, timings, "
         "unused parameters,\n"
         "                            DDP logging data, stalls\n"
         "  health [--service NAME]   grpc.health.v1 check (exit 0 when "
         "SERVING)\n"
         "  config                    the daemon's effective config\n"
         "  trace JOB --out FILE      the job's timeline as Chrome/Perfetto "
         "trace JSON\n"
         "flags:\n"
         "  --socket PATH   the daemon's socket (default: $GRADD_SOCKET, "
         "else gradd's default)\n"
         "  --json          machine-readable output\n"
         "  --timeout D     bound on the call (default 5s; e.g. 500ms, 2s)\n"
         "exit codes: 0 ok, 1 the daemon answered with an error (or not "
         "SERVING),\n"
         "            2 usage, 3 daemon unreachable / no answer in time\n";
}

absl::StatusOr<Options> ParseArgs(const std::vector<std::string>& args,
                                  const std::string& default_socket) {
  Options o;
  o.socket = default_socket;
  std::vector<std::string> positional;
  bool have_out = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "-h" || arg == "--help") {
      o.command = Command::kHelp;
      return o;
    }
    if (arg.size() < 2 || arg.substr(0, 2) != "--" || arg == "--") {
      positional.push_back(arg);
      continue;
    }
    std::string value;
    bool inline_value = false;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inline_value = true;
    }
    if (arg == "--json") {
      if (inline_value) {
        return absl::InvalidArgumentError("--json takes no value");
      }
      o.json = true;
      continue;
    }
    if (arg != "--socket" && arg != "--timeout" && arg != "--out" &&
        arg != "--service") {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg));
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
      }
      value = args[++i];
    }
    if (arg == "--socket") {
      if (value.empty()) {
        return absl::InvalidArgumentError("--socket needs a path");
      }
      o.socket = value;
    } else if (arg == "--timeout") {
      absl::StatusOr<absl::Duration> d = ParseTimeout(value);
      if (!d.ok()) return d.status();
      o.timeout = *d;
    } else if (arg == "--out") {
      if (value.empty()) {
        return absl::InvalidArgumentError("--out needs a file name");
      }
      o.out = value;
      have_out = true;
    } else {
      o.service = value;
    }
  }
  if (positional.empty()) {
    return absl::InvalidArgumentError("no command given");
  }
  const std::string& cmd = positional[0];
  size_t want = 1;
  if (cmd == "status") {
    o.command = Command::kStatus;
  } else if (cmd == "jobs") {
    o.command = Command::kJobs;
  } else if (cmd == "job") {
    o.command = Command::kJob;
    want = 2;
  } else if (cmd == "health") {
    o.command = Command::kHealth;
  } else if (cmd == "config") {
    o.command = Command::kConfig;
  } else if (cmd == "trace") {
    o.command = Command::kTrace;
    want = 2;
  } else if (cmd == "help") {
    o.command = Command::kHelp;
    return o;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown command '", cmd, "'"));
  }
  if (positional.size() < want) {
    return absl::InvalidArgumentError(
        absl::StrCat(cmd, " needs a job id (graddctl ", cmd, " ID)"));
  }
  if (positional.size() > want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unexpected argument '", positional[want], "' after ", cmd));
  }
  if (want == 2) o.job_id = positional[1];
  if (o.command == Command::kTrace && !have_out) {
    return absl::InvalidArgumentError(
        "trace needs --out FILE (- for standard output)");
  }
  if (o.command != Command::kTrace && have_out) {
    return absl::InvalidArgumentError("--out is only for trace");
  }
  if (o.command != Command::kHealth && !o.service.empty()) {
    return absl::InvalidArgumentError("--service is only for health");
  }
  if (o.socket.empty()) {
    return absl::InvalidArgumentError("no socket path (use --socket PATH)");
  }
  return o;
}

int ExitCodeFor(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
      return kExitOk;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return kExitUnreachable;
    default:
      return kExitError;
  }
}

}  // namespace gradd::ctl
