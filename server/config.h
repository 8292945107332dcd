// The daemon's configuration: gradd.v1.DaemonConfig
// (proto/gradd/v1/config.proto) read from YAML, with built-in defaults for
// every unset field and range checks. Pure functions; no global state: the
// resulting message is passed to the Daemon's constructor.
//
// Errors: INVALID_ARGUMENT naming the file, the key (dotted path, e.g.
// "rendezvous.formation_timeout_ms") and, for YAML problems, the line;
// NOT_FOUND when the file cannot be read.
#ifndef GRADD_SERVER_CONFIG_H_
#define GRADD_SERVER_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gradd/v1/config.pb.h"

namespace gradd {

// The longest rank_restart_grace_ms the daemon (config) or a job
// (AttachRequest) may ask for: one hour.
inline constexpr uint32_t kMaxRankRestartGraceMs = 3'600'000;
// Bounds of the elastic settings (DaemonConfig.min_nodes: the attach's
// node count bound; RendezvousConfig.reformation_settle_ms).
inline constexpr uint32_t kMaxMinNodes = 65536;
inline constexpr uint32_t kMaxReformationSettleMs = 600'000;
// RendezvousConfig.reformation_silence_ms: at least two of the 200 ms beats.
inline constexpr uint32_t kMinReformationSilenceMs = 400;

// Parses YAML text onto DaemonConfig field by field (snake_case keys as in
// config.proto). Unknown keys, wrong types and out-of-range numbers are
// errors. `source` names the text in messages (a file path or "<string>").
// Does not apply defaults.
absl::StatusOr<v1::DaemonConfig> ParseConfigYaml(absl::string_view yaml,
                                                 absl::string_view source);
// The same, adding one line to `*deprecations` for each deprecated key used
// (a key renamed to the engine's glossary: it still works for one release;
// the line names the file, the line, the old key and its new name).
// Setting a key and its deprecated name together is an error.
absl::StatusOr<v1::DaemonConfig> ParseConfigYaml(
    absl::string_view yaml, absl::string_view source,
    std::vector<std::string>* deprecations);

// Reads and parses `path` (ParseConfigYaml), applies defaults and validates;
// logs a warning for each deprecated key it used.
absl::StatusOr<v1::DaemonConfig> LoadConfigFile(const std::string& path);

// Fills every zero/empty field with its documented default.
void ApplyConfigDefaults(v1::DaemonConfig* config);

// Range checks on a config with defaults applied.
absl::Status ValidateConfig(const v1::DaemonConfig& config);
// autotune_caps_mb ("1,4,10,25,64"): the caps in MiB, each in (0, 1048576],
// at most 16; "" gives the default list. INVALID_ARGUMENT naming the bad
// entry otherwise.
absl::StatusOr<std::vector<double>> ParseAutotuneCaps(absl::string_view caps);
// autotune_partitions_mb ("0,1,4"): the same, 0 allowed (whole buckets);
// "" gives none.
absl::StatusOr<std::vector<double>> ParseAutotunePartitions(
    absl::string_view partitions);

// The credentials rule of the daemon <-> daemon plane (issue 20), checked
// on the final config, flags applied (a config file may leave the
// credentials to flags such as systemd's --rendezvous-token-file=%d/...):
// a multi-node daemon - rendezvous.coordinator_address, listen_address or
// expected_node_ids set - needs rendezvous.token_file or rendezvous.tls, or
// rendezvous.insecure: true; insecure together with credentials is a
// contradiction. INVALID_ARGUMENT naming the keys. Daemons without those
// settings are checked when a job asks for several nodes
// (CoordinatorSelector).
absl::Status ValidateNodeSecurity(const v1::DaemonConfig& config);

// A TCP listen address, host:port: a host name, IPv4 address or bracketed
// IPv6 address (none: every interface), and a port in 0..65535 (0:
// OS-chosen). INVALID_ARGUMENT
// saying what is wrong.
absl::Status ValidateListenAddress(absl::string_view address);

// This machine's host name ("localhost" if it has none): the default node_id
// and the address other daemons reach this one on when nothing is
// configured.
std::string HostName();

// Built-in defaults, validated: what gradd runs on without --config.
v1::DaemonConfig DefaultConfig();

// The effective config as YAML-compatible text (JSON is valid YAML), for
// --print-config and logs.
std::string ConfigToText(const v1::DaemonConfig& config);

}  // namespace gradd

#endif  // GRADD_SERVER_CONFIG_H_
