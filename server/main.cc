// gradd: the per-node gradient aggregation daemon. Parses flags and config,
// starts the Daemon and waits for SIGTERM/SIGINT (stop) and SIGHUP (reload
// the daemon credentials), taken synchronously with sigwait on this thread,
// so no logic runs in a signal handler.
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/fake_device_memory.h"
#include "server/config.h"
#include "server/daemon.h"
#include "server/logging.h"
#include "server/rendezvous/heap_trimmer.h"
#include "server/scheduling.h"
#include "server/systemd_notify.h"
#include "server/usage.h"

ABSL_FLAG(std::string, config, "",
          "YAML config file (gradd.v1.DaemonConfig); built-in defaults if "
          "empty");
ABSL_FLAG(std::string, socket, "",
          "Unix socket path; overrides the config's socket_path");
ABSL_FLAG(bool, print_config, false, "Print the effective config and exit");
ABSL_FLAG(std::string, rendezvous_listen, "",
          "host:port (port 0: OS-chosen) to serve the rendezvous store on, as "
          "the coordinator; overrides rendezvous.listen_address");
ABSL_FLAG(std::string, coordinator, "",
          "host:port of the coordinator's rendezvous store; overrides "
          "rendezvous.coordinator_address");
ABSL_FLAG(std::string, node_id, "", "This node's id; overrides node_id");
ABSL_FLAG(std::string, expected_nodes, "",
          "Comma-separated node ids of the cluster; overrides "
          "rendezvous.expected_node_ids");
ABSL_FLAG(int, rendezvous_port, 0,
          "Port of discovered coordinators (0: rendezvous.port, default "
          "29600); overrides rendezvous.port");
ABSL_FLAG(std::string, interface, "",
          "Network interface carrying the daemons' traffic (like "
          "GLOO_SOCKET_IFNAME); overrides rendezvous.interface and "
          "$GRADD_SOCKET_IFNAME");
ABSL_FLAG(std::string, advertise_host, "",
          "Address the other daemons reach this one on; overrides "
          "rendezvous.advertise_host");
ABSL_FLAG(std::string, rendezvous_token_file, "",
          "File holding the shared token of the cluster's daemons (e.g. "
          "$CREDENTIALS_DIRECTORY/gradd-token under systemd); overrides "
          "rendezvous.token_file");
ABSL_FLAG(std::string, rendezvous_tls_cert, "",
          "PEM certificate of this daemon (mutual TLS between daemons); "
          "overrides rendezvous.tls.cert_file");
ABSL_FLAG(std::string, rendezvous_tls_key, "",
          "PEM private key of this daemon; overrides rendezvous.tls.key_file");
ABSL_FLAG(std::string, rendezvous_tls_ca, "",
          "PEM CA certificate(s) every daemon's certificate is signed by; "
          "overrides rendezvous.tls.ca_file");
ABSL_FLAG(std::string, rendezvous_tls_server_name, "",
          "Name checked in the coordinator's certificate; overrides "
          "rendezvous.tls.server_name");
ABSL_FLAG(bool, rendezvous_insecure, false,
          "Daemon <-> daemon calls without credentials (trusted, isolated "
          "networks only); sets rendezvous.insecure");
ABSL_FLAG(std::string, log_level, "",
          "Least severe level logged: trace, debug, info, warning, error, "
          "off; overrides log_level (default info)");
ABSL_FLAG(std::string, fake_gpus, "",
          "Testing only: serve CUDA parameters from host memory standing in "
          "for GPUs with these UUIDs (32 hex digits each, comma-separated); "
          "trainers set GRADD_FAKE_GPU_UUID to one of them");
ABSL_FLAG(std::string, rendezvous_port_file, "",
          "Write the rendezvous server's port to this file once it listens "
          "(for scripts and tests that let the OS choose it)");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port (port 0: OS-chosen) of the Prometheus /metrics "
          "endpoint; overrides metrics.listen_address");
ABSL_FLAG(std::string, metrics_port_file, "",
          "Write the /metrics endpoint's port to this file once it listens");

namespace {
char kPrintConfig[] = "--print_config";

// Written whole under a temporary name, then renamed, so a reader never sees
// a partial number.
void WritePortFile(const std::string& file, int port) {
  if (file.empty()) return;
  const std::string tmp = file + ".tmp";
  std::ofstream(tmp) << port << "\n";
  if (std::rename(tmp.c_str(), file.c_str()) != 0) {
    spdlog::error("cannot write {}", file);
  }
}

// absl flag names are identifiers; accept the dashed spellings too.
void UndashFlagNames(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--print-config") {
      argv[i] = kPrintConfig;
      continue;
    }
    char* arg = argv[i];
    if (arg[0] != '-' || arg[1] != '-') continue;
    for (char* c = arg + 2; *c != '\0' && *c != '='; ++c) {
      if (*c == '-') *c = '_';
    }
  }
}
}  // namespace

int main(int argc, char** argv) {
  constexpr char kUsage[] = "gradd [FLAGS]";
  absl::SetProgramUsageMessage(kUsage);
  if (std::optional<int> done = gradd::HandleHelpOrVersion(
          argc, argv, kUsage,
          "The per-node gradient aggregation daemon: trainers on this machine "
          "attach through its Unix socket and their gradients are averaged "
          "across every rank of their job, on this node and (through the "
          "rendezvous coordinator) on others. Flags override the config "
          "file's keys. SIGTERM/SIGINT stop it cleanly; SIGHUP re-reads the "
          "daemon credentials (rendezvous.token_file, rendezvous.tls). Docs: "
          "docs/operations.md.",
          "server/main.cc", std::cout)) {
    return *done;
  }
  UndashFlagNames(argc, argv);
  absl::ParseCommandLine(argc, argv);
  // The flag's level at once (config errors are logged too); the config's
  // log_level once it is read, unless the flag chose.
  const std::string level_flag = absl::GetFlag(FLAGS_log_level);
  if (absl::Status logging =
          gradd::InitLogging(level_flag.empty() ? "info" : level_flag);
      !logging.ok()) {
    std::cerr << "gradd: --log-level: " << logging.message() << "\n";
    return 2;
  }
  // Not dumpable (issue 20): a process of the daemon's uid (a trainer, when
  // the daemon runs as the trainers' user) can then neither ptrace it nor
  // open its /proc/<pid>/mem, environ or fd/ entries, so it cannot write into
  // the memory that serves every job on the node or read other jobs' data
  // through /proc. The price: no core dumps, and debuggers need
  // CAP_SYS_PTRACE (docs/operations.md). Set before any thread starts.
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
    spdlog::warn(
        "prctl(PR_SET_DUMPABLE, 0) failed: {}; processes of uid {} "
        "can read and write this daemon's memory through /proc",
        std::strerror(errno), geteuid());
  }

  // Large freed blocks go back to the system instead of staying in the
  // arenas of gRPC's threads (heap_trimmer.h). Before any thread starts.
  gradd::HeapTrimmer::FixMallocThresholds();

  // Block the stop signals and SIGHUP (reload the daemon credentials)
  // before any thread exists so every thread inherits the mask and only
  // sigwait below receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A trainer vanishing mid-send must be an error return, not our death.
  signal(SIGPIPE, SIG_IGN);

  gradd::v1::DaemonConfig config;
  if (const std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    absl::StatusOr<gradd::v1::DaemonConfig> loaded =
        gradd::LoadConfigFile(path);
    if (!loaded.ok()) {
      spdlog::error("{}", loaded.status().message());
      return 2;
    }
    config = *std::move(loaded);
  } else {
    config = gradd::DefaultConfig();
  }
  if (const std::string socket = absl::GetFlag(FLAGS_socket); !socket.empty()) {
    config.set_socket_path(socket);
  }
  if (const std::string v = absl::GetFlag(FLAGS_rendezvous_listen);
      !v.empty()) {
    config.mutable_rendezvous()->set_listen_address(v);
  }
  if (const std::string v = absl::GetFlag(FLAGS_coordinator); !v.empty()) {
    config.mutable_rendezvous()->set_coordinator_address(v);
  }
  if (const std::string v = absl::GetFlag(FLAGS_node_id); !v.empty()) {
    config.set_node_id(v);
  }
  if (const std::string v = absl::GetFlag(FLAGS_metrics_listen); !v.empty()) {
    config.mutable_metrics()->set_listen_address(v);
  }
  if (const std::string v = absl::GetFlag(FLAGS_expected_nodes); !v.empty()) {
    config.mutable_rendezvous()->set_expected_node_ids(v);
  }
  if (const int v = absl::GetFlag(FLAGS_rendezvous_port); v != 0) {
    if (v < 0 || v > 65535) {
      spdlog::error("--rendezvous-port {} is not in 1..65535", v);
      return 2;
    }
    config.mutable_rendezvous()->set_port(static_cast<uint32_t>(v));
  }
  if (const std::string v = absl::GetFlag(FLAGS_interface); !v.empty()) {
    config.mutable_rendezvous()->set_interface(v);
  }
  if (const std::string v = absl::GetFlag(FLAGS_advertise_host); !v.empty()) {
    config.mutable_rendezvous()->set_advertise_host(v);
  }
  if (const std::string v = absl::GetFlag(FLAGS_rendezvous_token_file);
      !v.empty()) {
    config.mutable_rendezvous()->set_token_file(v);
  }
  if (const std::string v = absl::GetFlag(FLAGS_rendezvous_tls_cert);
      !v.empty()) {
    config.mutable_rendezvous()->mutable_tls()->set_cert_file(v);
  }
  if (const std::string v = absl::GetFlag(FLAGS_rendezvous_tls_key);
      !v.empty()) {
    config.mutable_rendezvous()->mutable_tls()->set_key_file(v);
  }
  if (const std::string v = absl::GetFlag(FLAGS_rendezvous_tls_ca);
      !v.empty()) {
    config.mutable_rendezvous()->mutable_tls()->set_ca_file(v);
  }
  if (const std::string v = absl::GetFlag(FLAGS_rendezvous_tls_server_name);
      !v.empty()) {
    config.mutable_rendezvous()->mutable_tls()->set_server_name(v);
  }
  if (absl::GetFlag(FLAGS_rendezvous_insecure)) {
    config.mutable_rendezvous()->set_insecure(true);
  }
  if (absl::Status valid = gradd::ValidateConfig(config); !valid.ok()) {
    spdlog::error("{}", valid.message());
    return 2;
  }
  if (absl::Status secure = gradd::ValidateNodeSecurity(config); !secure.ok()) {
    spdlog::error("{}", secure.message());
    return 2;
  }
  if (!level_flag.empty()) config.set_log_level(level_flag);
  if (absl::Status logging = gradd::InitLogging(config.log_level());
      !logging.ok()) {
    spdlog::error("log_level: {}", logging.message());
    return 2;
  }
  if (absl::GetFlag(FLAGS_print_config)) {
    std::cout << gradd::ConfigToText(config) << "\n";
    return 0;
  }

  // Before any thread starts: threads inherit the niceness.
  if (absl::Status nice = gradd::ApplyNiceness(config.nice()); !nice.ok()) {
    spdlog::warn("nice: {}; running at niceness {}", nice.message(),
                 gradd::CurrentNiceness());
  }

  // A no-op unless systemd (Type=notify) started us.
  std::unique_ptr<gradd::SystemdNotifier> notifier =
      gradd::SystemdNotifier::FromEnvironment();
  std::unique_ptr<gradd::DeviceAllocatorInterface> devices;
  if (const std::string v = absl::GetFlag(FLAGS_fake_gpus); !v.empty()) {
    std::vector<std::string> uuids;
    for (absl::string_view hex : absl::StrSplit(v, ',')) {
      if (hex.size() != 32 ||
          !std::all_of(hex.begin(), hex.end(), absl::ascii_isxdigit)) {
        spdlog::error("--fake_gpus: '{}' is not 32 hex digits",
                      std::string(hex));
        return 2;
      }
      uuids.push_back(absl::HexStringToBytes(hex));
    }
    spdlog::warn(
        "serving CUDA parameters from host memory for {} fake GPUs "
        "(--fake_gpus, for tests)",
        uuids.size());
    devices = std::make_unique<gradd::FakeDeviceAllocator>(std::move(uuids));
  }
  absl::StatusOr<std::unique_ptr<gradd::Daemon>> daemon =
      gradd::Daemon::Create(config, std::move(devices));
  if (!daemon.ok()) {
    spdlog::error("{}", daemon.status().message());
    return 1;
  }
  spdlog::info(
      "gradd listening on unix:{} (sessions on {}, {} reduce threads, node id "
      "'{}')",
      (*daemon)->socket_path(), (*daemon)->session_path(),
      config.reduce_threads(), config.node_id());
  if (const int port = (*daemon)->rendezvous_port(); port != 0) {
    spdlog::info("gradd rendezvous listening on {} (port {})",
                 (*daemon)->rendezvous_address(), port);
    WritePortFile(absl::GetFlag(FLAGS_rendezvous_port_file), port);
  }
  if (const int port = (*daemon)->metrics_port(); port != 0) {
    spdlog::info("gradd metrics on http://{}/metrics (port {})",
                 config.metrics().listen_address(), port);
    WritePortFile(absl::GetFlag(FLAGS_metrics_port_file), port);
  }

  // Create() returned: every socket is bound and served.
  notifier->Ready(absl::StrCat("serving on unix:", (*daemon)->socket_path()));
  if (notifier->WatchdogInterval() != absl::InfiniteDuration()) {
    spdlog::info("systemd watchdog: pinging every {}",
                 absl::FormatDuration(notifier->WatchdogInterval()));
    (*daemon)->job_manager().SetWatchdog(
        [n = notifier.get()] { n->Watchdog(); }, notifier->WatchdogInterval());
  }

  int sig = 0;
  while (true) {
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig != SIGHUP) break;
    // Errors are logged; the old credentials stay in force.
    (void)(*daemon)->ReloadCredentials();
  }
  const char* sig_name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
  spdlog::info("{}, shutting down", sig_name);
  notifier->Stopping(absl::StrCat(sig_name, ", shutting down"));
  (*daemon)->Shutdown();
  daemon->reset();
  spdlog::info("stopped");
  return 0;
}
