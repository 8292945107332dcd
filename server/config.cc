#include "server/config.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/client_strings.h"
#include "common/session.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "server/auth/node_credentials.h"
#include "server/hooks/comm_hook_factory.h"
#include "server/logging.h"
#include "server/rendezvous/coordinator.h"
#include "yaml-cpp/yaml.h"

namespace gradd {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// rendezvous.etcd.lease_ttl_ms by default: how long after its last
// keep-alive a vanished daemon's liveness keys go, i.e. how soon the
// others stop waiting for it in a re-formation (config.proto).
constexpr uint32_t kDefaultEtcdLeaseTtlMs = 10000;
constexpr double kDefaultBucketCapMb = 25;
constexpr double kDefaultFirstBucketCapMb = 1;
// Network scheduling between nodes (config/gradd.yaml: why these).
constexpr char kDefaultScheduling[] = "priority";
constexpr double kDefaultPartitionMb = 0;
constexpr uint32_t kDefaultAttachTimeoutMs = 60000;
constexpr uint32_t kDefaultMaxJobs = 64;
constexpr uint32_t kDefaultMaxParams = 100000;
constexpr uint64_t kDefaultMaxJobMemoryBytes = uint64_t{64} << 30;
constexpr uint32_t kDefaultMaxLocalWorldSize = 256;
constexpr uint32_t kDefaultSpinUs = 50;
constexpr uint32_t kDefaultFormationTimeoutMs = 60000;
constexpr uint32_t kDefaultCollectiveTimeoutMs = 30000;
// Elastic jobs: how long a re-formation waits for a node that has not come
// back (config.proto's reformation_settle_ms).
constexpr uint32_t kDefaultReformationSettleMs = 3000;
// ... and how long a node of the job may be silent before it stops waiting
// for it (config.proto's reformation_silence_ms).
constexpr uint32_t kDefaultReformationSilenceMs = 1000;
// Well below the fd limit the daemon raises itself to (see main.cc), so idle
// connections can never use up the descriptors the jobs need.
constexpr uint32_t kDefaultMaxSessions = 1024;
constexpr uint32_t kDefaultMaxSessionsPerUid = 256;
constexpr uint32_t kDefaultSessionIdleTimeoutMs = 30000;
constexpr uint32_t kDefaultHeartbeatIntervalMs = 250;
constexpr uint32_t kDefaultStallWarningMs = 10000;
constexpr uint32_t kDefaultTimelineEvents = 16384;
constexpr int32_t kDefaultNice = -10;  // server/scheduling.h
constexpr uint32_t kMaxTimelineEvents = 1 << 24;
// The rendezvous store's limits (config.proto, RendezvousLimits, says why).
constexpr uint32_t kDefaultMaxKeyBytes = 1024;
constexpr uint64_t kDefaultMaxValueBytes = uint64_t{32} << 20;
constexpr uint32_t kDefaultMaxKeysPerJob = 65536;
constexpr uint64_t kDefaultMaxJobBytes = uint64_t{512} << 20;
constexpr uint64_t kDefaultMaxTotalBytes = uint64_t{1} << 30;
constexpr uint32_t kDefaultMaxRoundsPerJobPerMinute = 60;
constexpr uint32_t kDefaultJobTtlS = 86400;
// gRPC messages carry a value plus 1 MiB and are sized by an int.
constexpr uint64_t kMaxValueBytes = uint64_t{1} << 30;

// Longest string value (a path, an address list).
constexpr size_t kMaxConfigStringBytes = 4096;

// sockaddr_un.sun_path holds 108 bytes including the NUL.
constexpr size_t kMaxSocketPathBytes = 107 - sizeof(".session") + 1;

std::string Where(absl::string_view source, const std::string& key,
                  const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.line >= 0) {
    return absl::StrCat(source, ":", mark.line + 1, ": key '", key, "'");
  }
  return absl::StrCat(source, ": key '", key, "'");
}

// Keys renamed to the engine's glossary (server/engine/README.md): the old
// key still works for one release and warns (ParseConfigYaml's
// `deprecations`, logged by LoadConfigFile). Dotted path of the old key ->
// the field's new name in the same message.
struct DeprecatedKey {
  absl::string_view old_key;
  absl::string_view new_name;
};
constexpr DeprecatedKey kDeprecatedKeys[] = {
    {"rendezvous.join_timeout_ms", "formation_timeout_ms"},
    {"rendezvous.reform_settle_ms", "reformation_settle_ms"},
    {"rendezvous.reform_silence_ms", "reformation_silence_ms"},
};

// The field an old key stands for now (nullptr if `key` is not an old
// key), with the deprecation said in `*note`.
const FieldDescriptor* DeprecatedField(const google::protobuf::Descriptor* d,
                                       const std::string& key,
                                       const std::string& prefix,
                                       std::string* note) {
  for (const DeprecatedKey& k : kDeprecatedKeys) {
    if (k.old_key != key) continue;
    const FieldDescriptor* field = d->FindFieldByName(std::string(k.new_name));
    if (field == nullptr) return nullptr;
    const std::string new_key = prefix.empty()
                                    ? std::string(k.new_name)
                                    : absl::StrCat(prefix, ".", k.new_name);
    *note = absl::StrCat(key,
                         " is deprecated and will be removed in the next "
                         "release: use ",
                         new_key);
    return field;
  }
  return nullptr;
}

std::string KnownKeys(const google::protobuf::Descriptor* d) {
  std::vector<std::string> names;
  for (int i = 0; i < d->field_count(); ++i) {
    names.push_back(d->field(i)->name());
  }
  return absl::StrJoin(names, ", ");
}

// yaml-cpp reports errors by exception; this file is the edge where they are
// turned into statuses, so nothing here lets one escape.
absl::Status SetScalar(const FieldDescriptor* field, const YAML::Node& value,
                       Message* msg, absl::string_view source,
                       const std::string& key) {
  if (!value.IsScalar()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(source, key, value), ": expected a ", field->type_name(),
        " value, got a ", value.IsMap() ? "map" : "list or null"));
  }
  const std::string& text = value.Scalar();
  const Reflection* r = msg->GetReflection();
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, key, value), ": '", text, "' is not ", why));
  };
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      // Config strings reach logs, metric labels and other daemons (as
      // proto3 strings, which must be UTF-8): the rules of client strings
      // apply (common/client_strings.h).
      if (absl::Status s = CheckClientString(Where(source, key, value), text,
                                             kMaxConfigStringBytes);
          !s.ok()) {
        return s;
      }
      r->SetString(msg, field, text);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      // A number with a `<name less its unit>_auto` switch beside it
      // (bucket_cap_mb: auto sets bucket_cap_auto) takes `auto`, which
      // sets the switch and leaves the number to its default.
      const FieldDescriptor* automatic = msg->GetDescriptor()->FindFieldByName(
          absl::StrCat(absl::StripSuffix(field->name(), "_mb"), "_auto"));
      if (automatic != nullptr &&
          automatic->cpp_type() != FieldDescriptor::CPPTYPE_BOOL) {
        automatic = nullptr;
      }
      if (automatic != nullptr && text == "auto") {
        r->SetBool(msg, automatic, true);
        return absl::OkStatus();
      }
      double v;
      if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
        return bad(automatic != nullptr ? "a finite number or 'auto'"
                                        : "a finite number");
      }
      r->SetDouble(msg, field, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      uint32_t v;
      if (!absl::SimpleAtoi(text, &v)) {
        return bad("a non-negative integer below 2^32");
      }
      r->SetUInt32(msg, field, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t v;
      if (!absl::SimpleAtoi(text, &v)) return bad("a non-negative integer");
      r->SetUInt64(msg, field, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT32: {
      int32_t v;
      if (!absl::SimpleAtoi(text, &v)) return bad("a 32-bit integer");
      r->SetInt32(msg, field, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t v;
      if (!absl::SimpleAtoi(text, &v)) return bad("an integer");
      r->SetInt64(msg, field, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      bool v;
      if (!absl::SimpleAtob(text, &v)) return bad("true or false");
      r->SetBool(msg, field, v);
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(Where(source, key, value), ": field type ",
                       field->type_name(), " is not supported in YAML"));
  }
}

absl::Status MapOntoMessage(const YAML::Node& map, Message* msg,
                            absl::string_view source, const std::string& prefix,
                            std::vector<std::string>* deprecations) {
  const google::protobuf::Descriptor* d = msg->GetDescriptor();
  // The fields set so far in this map, by the key that set them: an old key
  // and its new name together are an error, not a silent winner.
  absl::flat_hash_map<const FieldDescriptor*, std::string> set_by;
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (!it->first.IsScalar()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": keys must be plain names"));
    }
    const std::string name = it->first.Scalar();
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    const FieldDescriptor* field = d->FindFieldByName(name);
    if (field == nullptr) {
      std::string note;
      field = DeprecatedField(d, key, prefix, &note);
      if (field != nullptr) {
        deprecations->push_back(
            absl::StrCat(Where(source, key, it->first), ": ", note));
      }
    }
    if (field != nullptr) {
      auto [previous, first] = set_by.emplace(field, key);
      if (!first && previous->second == key) {
        return absl::InvalidArgumentError(
            absl::StrCat(Where(source, key, it->first), " is set twice"));
      }
      if (!first) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(source, key, it->first), " sets the same setting as '",
            previous->second,
            "' (one is the deprecated name of the other): keep one"));
      }
    }
    if (field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(source, key, it->first), " is not a known setting (known in ",
          prefix.empty() ? "the top level" : prefix, ": ", KnownKeys(d), ")"));
    }
    // A copy: yaml-cpp iterators yield temporaries, so a reference to
    // it->second dangles after this statement (caught by ASan).
    const YAML::Node value = it->second;
    if (field->is_repeated()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(source, key, value), ": lists are not supported"));
    }
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (value.IsNull()) continue;
      if (!value.IsMap()) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(source, key, value), ": expected a map of settings"));
      }
      RETURN_IF_ERROR(MapOntoMessage(
          value, msg->GetReflection()->MutableMessage(msg, field), source, key,
          deprecations));
      continue;
    }
    RETURN_IF_ERROR(SetScalar(field, value, msg, source, key));
  }
  return absl::OkStatus();
}

// Which setting makes this a multi-node daemon ("" if none): a configured
// coordinator, a store served from start-up or a list of cluster nodes all
// say "this daemon talks to others over the network". Daemons without them
// may still be asked for a multi-node job (coordinator discovery); the
// CoordinatorSelector refuses those jobs without credentials.
std::string MultiNodeSetting(const v1::RendezvousConfig& rv) {
  if (!rv.coordinator_address().empty())
    return "rendezvous.coordinator_address";
  if (!rv.listen_address().empty()) return "rendezvous.listen_address";
  if (!rv.expected_node_ids().empty()) return "rendezvous.expected_node_ids";
  if (rv.backend() == "etcd") return "rendezvous.backend: etcd";
  return "";
}

}  // namespace

absl::Status ValidateNodeSecurity(const v1::DaemonConfig& config) {
  const v1::RendezvousConfig& rv = config.rendezvous();
  const bool credentials = HasNodeCredentials(rv);
  if (rv.insecure() && credentials) {
    return absl::InvalidArgumentError(
        "rendezvous.insecure: true contradicts rendezvous.token_file / "
        "rendezvous.tls: remove insecure to use the credentials");
  }
  const std::string setting = MultiNodeSetting(rv);
  if (!setting.empty() && !credentials && !rv.insecure()) {
    return absl::InvalidArgumentError(absl::StrCat(
        setting,
        " makes this a multi-node daemon, but it has no credentials for the "
        "other daemons: set rendezvous.token_file and/or rendezvous.tls "
        "(cert_file, key_file, ca_file) on every node, or rendezvous.insecure: "
        "true on a network nobody else can reach (docs/operations.md, "
        "\"Securing the daemons' network\")"));
  }
  return absl::OkStatus();
}

namespace {

absl::Status ValidateRendezvousBackend(const v1::RendezvousConfig& rv) {
  if (rv.backend() != "builtin" && rv.backend() != "etcd") {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous.backend = '", rv.backend(),
                     "': expected builtin (the default) or etcd"));
  }
  const v1::RendezvousEtcdConfig& e = rv.etcd();
  if (rv.backend() != "etcd") {
    if (!e.endpoints().empty()) {
      return absl::InvalidArgumentError(
          "rendezvous.etcd.endpoints is set but rendezvous.backend is not "
          "etcd: set rendezvous.backend: etcd to use it");
    }
    return absl::OkStatus();
  }
  std::vector<absl::string_view> endpoints;
  for (absl::string_view entry : absl::StrSplit(e.endpoints(), ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (!entry.empty()) endpoints.push_back(entry);
  }
  if (endpoints.empty()) {
    return absl::InvalidArgumentError(
        "rendezvous.backend: etcd needs rendezvous.etcd.endpoints "
        "(comma-separated host:port of the etcd members)");
  }
  // As EtcdClient reads them: an optional http:// or https://, host:port,
  // an optional trailing '/'. Checked with the rest of the config, so that
  // the error names the key (EtcdClient would refuse it only at start).
  for (absl::string_view entry : endpoints) {
    absl::string_view v = entry;
    if (!absl::ConsumePrefix(&v, "https://"))
      absl::ConsumePrefix(&v, "http://");
    absl::ConsumeSuffix(&v, "/");
    const size_t colon = v.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(v.substr(colon + 1), &port) || port <= 0 ||
        port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rendezvous.etcd.endpoints: '", entry,
          "' is not host:port (e.g. 10.0.0.1:2379, comma-separated)"));
    }
  }
  if (!rv.coordinator_address().empty() || !rv.listen_address().empty()) {
    return absl::InvalidArgumentError(
        "rendezvous.backend: etcd has no coordinator: remove "
        "rendezvous.coordinator_address / rendezvous.listen_address");
  }
  if (e.cert_file().empty() != e.key_file().empty()) {
    return absl::InvalidArgumentError(
        "rendezvous.etcd.cert_file and rendezvous.etcd.key_file go together");
  }
  if (!e.cert_file().empty() && e.ca_file().empty()) {
    return absl::InvalidArgumentError(
        "rendezvous.etcd.cert_file needs rendezvous.etcd.ca_file (the CA "
        "that signed etcd's certificate)");
  }
  if (e.user().empty() != e.password_file().empty()) {
    return absl::InvalidArgumentError(
        "rendezvous.etcd.user and rendezvous.etcd.password_file go together");
  }
  if (e.lease_ttl_ms() < 2000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous.etcd.lease_ttl_ms = ", e.lease_ttl_ms(),
        " is below 2000 (etcd counts leases in whole seconds, and the "
        "lease is renewed every third of it)"));
  }
  if (e.prefix().empty() || e.prefix()[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous.etcd.prefix = '", e.prefix(), "': must start with '/'"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRendezvousLimits(const v1::RendezvousLimits& l) {
  auto bad = [](absl::string_view key, uint64_t v, absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous.limits.", key, " = ", v, " ", why));
  };
  if (l.max_key_bytes() > 65536) {
    return bad("max_key_bytes", l.max_key_bytes(), "is above 65536");
  }
  if (l.max_value_bytes() > kMaxValueBytes) {
    return bad("max_value_bytes", l.max_value_bytes(),
               "is above 1073741824 (1 GiB)");
  }
  if (l.max_job_bytes() < l.max_value_bytes()) {
    return bad("max_job_bytes", l.max_job_bytes(),
               absl::StrCat("is below max_value_bytes = ", l.max_value_bytes(),
                            ": no job could store its largest value"));
  }
  if (l.max_total_bytes() < l.max_job_bytes()) {
    return bad("max_total_bytes", l.max_total_bytes(),
               absl::StrCat("is below max_job_bytes = ", l.max_job_bytes()));
  }
  return absl::OkStatus();
}

}  // namespace

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') {
    return "localhost";
  }
  return buf;
}

absl::StatusOr<v1::DaemonConfig> ParseConfigYaml(absl::string_view yaml,
                                                 absl::string_view source) {
  std::vector<std::string> deprecations;
  return ParseConfigYaml(yaml, source, &deprecations);
}

absl::StatusOr<v1::DaemonConfig> ParseConfigYaml(
    absl::string_view yaml, absl::string_view source,
    std::vector<std::string>* deprecations) {
  v1::DaemonConfig config;
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.mark.line + 1, ": invalid YAML: ", e.msg));
  }
  if (root.IsNull()) return config;  // empty file: all defaults
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": the top level must be a map of settings (key: value)"));
  }
  try {
    RETURN_IF_ERROR(MapOntoMessage(root, &config, source, "", deprecations));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.mark.line + 1, ": ", e.msg));
  }
  return config;
}

namespace {

// A comma-separated list of MiB for the setting `key`; each in (0, 2^20]
// (or [0, 2^20] with `zero`), at most 16.
absl::StatusOr<std::vector<double>> ParseMibList(absl::string_view key,
                                                 absl::string_view list,
                                                 bool zero) {
  std::vector<double> out;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    double v = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(entry), &v) ||
        !(v > 0 || (zero && v == 0)) || v > 1 << 20) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, " = '", list, "': '", entry, "' is not a size in ",
                       zero ? "[0" : "(0", ", 1048576] MiB (write e.g. '",
                       zero ? "0,1,4" : "1,4,10,25,64", "')"));
    }
    out.push_back(v);
  }
  if (out.size() > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " = '", list, "' lists ", out.size(),
                     " sizes; at most 16 (each is a trial of the job's "
                     "iterations)"));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<double>> ParseAutotuneCaps(absl::string_view caps) {
  return ParseMibList("autotune_caps_mb", caps.empty() ? "1,4,10,25,64" : caps,
                      /*zero=*/false);
}

absl::StatusOr<std::vector<double>> ParseAutotunePartitions(
    absl::string_view partitions) {
  if (partitions.empty()) return std::vector<double>{};
  return ParseMibList("autotune_partitions_mb", partitions, /*zero=*/true);
}

absl::StatusOr<v1::DaemonConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read config file ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  std::vector<std::string> deprecations;
  ASSIGN_OR_RETURN(v1::DaemonConfig config,
                   ParseConfigYaml(text.str(), path, &deprecations));
  for (const std::string& note : deprecations) spdlog::warn("{}", note);
  ApplyConfigDefaults(&config);
  absl::Status valid = ValidateConfig(config);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", valid.message()));
  }
  return config;
}

void ApplyConfigDefaults(v1::DaemonConfig* c) {
  if (c->socket_path().empty()) c->set_socket_path(DefaultSocketPath());
  if (c->bucket_cap_mb() == 0) c->set_bucket_cap_mb(kDefaultBucketCapMb);
  if (c->first_bucket_cap_mb() == 0) {
    c->set_first_bucket_cap_mb(kDefaultFirstBucketCapMb);
  }
  if (c->reduce_threads() == 0) {
    c->set_reduce_threads(std::max(1u, std::thread::hardware_concurrency()));
  }
  if (c->attach_timeout_ms() == 0) {
    c->set_attach_timeout_ms(kDefaultAttachTimeoutMs);
  }
  if (c->max_jobs() == 0) c->set_max_jobs(kDefaultMaxJobs);
  if (c->max_params() == 0) c->set_max_params(kDefaultMaxParams);
  if (c->max_job_memory_bytes() == 0) {
    c->set_max_job_memory_bytes(kDefaultMaxJobMemoryBytes);
  }
  if (c->max_local_world_size() == 0) {
    c->set_max_local_world_size(kDefaultMaxLocalWorldSize);
  }
  if (c->spin_us() == 0) c->set_spin_us(kDefaultSpinUs);
  if (c->max_sessions() == 0) c->set_max_sessions(kDefaultMaxSessions);
  if (c->max_sessions_per_uid() == 0) {
    c->set_max_sessions_per_uid(kDefaultMaxSessionsPerUid);
  }
  if (c->max_sessions_per_process() == 0) {
    // Half the uid's: another process of the uid always finds room.
    c->set_max_sessions_per_process(
        std::max(1u, c->max_sessions_per_uid() / 2));
  }
  if (c->session_idle_timeout_ms() == 0) {
    c->set_session_idle_timeout_ms(kDefaultSessionIdleTimeoutMs);
  }
  if (c->heartbeat_interval_ms() == 0) {
    c->set_heartbeat_interval_ms(kDefaultHeartbeatIntervalMs);
  }
  if (!c->has_stall_warning_ms()) {
    c->set_stall_warning_ms(kDefaultStallWarningMs);
  }
  if (!c->has_nice()) c->set_nice(kDefaultNice);
  if (c->timeline_events() == 0) {
    c->set_timeline_events(kDefaultTimelineEvents);
  }
  if (c->node_id().empty()) c->set_node_id(HostName());
  if (c->log_level().empty()) c->set_log_level("info");
  if (c->scheduling().empty()) c->set_scheduling(kDefaultScheduling);
  if (!c->has_partition_mb()) c->set_partition_mb(kDefaultPartitionMb);
  v1::RendezvousConfig* rv = c->mutable_rendezvous();
  if (rv->formation_timeout_ms() == 0)
    rv->set_formation_timeout_ms(kDefaultFormationTimeoutMs);
  if (rv->collective_timeout_ms() == 0) {
    rv->set_collective_timeout_ms(kDefaultCollectiveTimeoutMs);
  }
  if (rv->port() == 0) rv->set_port(kDefaultRendezvousPort);
  if (rv->reformation_settle_ms() == 0) {
    rv->set_reformation_settle_ms(kDefaultReformationSettleMs);
  }
  if (rv->reformation_silence_ms() == 0) {
    rv->set_reformation_silence_ms(kDefaultReformationSilenceMs);
  }
  v1::RendezvousLimits* l = rv->mutable_limits();
  if (l->max_key_bytes() == 0) l->set_max_key_bytes(kDefaultMaxKeyBytes);
  if (l->max_value_bytes() == 0) l->set_max_value_bytes(kDefaultMaxValueBytes);
  if (l->max_keys_per_job() == 0) {
    l->set_max_keys_per_job(kDefaultMaxKeysPerJob);
  }
  if (l->max_job_bytes() == 0) l->set_max_job_bytes(kDefaultMaxJobBytes);
  if (l->max_total_bytes() == 0) l->set_max_total_bytes(kDefaultMaxTotalBytes);
  if (l->max_rounds_per_job_per_minute() == 0) {
    l->set_max_rounds_per_job_per_minute(kDefaultMaxRoundsPerJobPerMinute);
  }
  if (l->job_ttl_s() == 0) l->set_job_ttl_s(kDefaultJobTtlS);
  if (rv->backend().empty()) rv->set_backend("builtin");
  if (rv->backend() == "etcd") {
    v1::RendezvousEtcdConfig* etcd = rv->mutable_etcd();
    if (etcd->prefix().empty()) etcd->set_prefix("/gradd/");
    if (etcd->lease_ttl_ms() == 0) {
      etcd->set_lease_ttl_ms(kDefaultEtcdLeaseTtlMs);
    }
  }
  if (rv->interface().empty()) {
    if (const char* v = std::getenv("GRADD_SOCKET_IFNAME"); v != nullptr) {
      rv->set_interface(v);
    }
  }
}

absl::Status ValidateConfig(const v1::DaemonConfig& c) {
  if (c.socket_path().empty() || c.socket_path()[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket_path '", c.socket_path(), "' must be an absolute path"));
  }
  if (c.socket_path().size() > kMaxSocketPathBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket_path '", c.socket_path(), "' is ", c.socket_path().size(),
        " bytes; Unix socket paths (plus '.session') are limited to ",
        kMaxSocketPathBytes));
  }
  // 0 was replaced by the default, so only negative / absurd caps remain.
  for (auto [name, v] :
       {std::pair<const char*, double>{"bucket_cap_mb", c.bucket_cap_mb()},
        {"first_bucket_cap_mb", c.first_bucket_cap_mb()}}) {
    if (!(v > 0) || v > 1 << 20) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " = ", v, " is out of range (0, 1048576] MiB"));
    }
  }
  if (absl::StatusOr<std::vector<double>> caps =
          ParseAutotuneCaps(c.autotune_caps_mb());
      !caps.ok()) {
    return caps.status();
  }
  if (absl::StatusOr<std::vector<double>> partitions =
          ParseAutotunePartitions(c.autotune_partitions_mb());
      !partitions.ok()) {
    return partitions.status();
  }
  for (auto [name, v] :
       {std::pair<const char*, uint32_t>{"autotune_warmup_iterations",
                                         c.autotune_warmup_iterations()},
        {"autotune_measured_iterations", c.autotune_measured_iterations()}}) {
    if (v > 1000) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " = ", v, " is above 1000"));
    }
  }
  if (c.nice() < -20 || c.nice() > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("nice = ", c.nice(), " is outside [-20, 19]"));
  }
  if (c.reduce_threads() > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce_threads = ", c.reduce_threads(), " is above 1024"));
  }
  if (c.scheduling() != "priority" && c.scheduling() != "none") {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduling = '", c.scheduling(),
                     "' is not one of 'priority', 'none'"));
  }
  if (!(c.partition_mb() >= 0) || c.partition_mb() > 1 << 20) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition_mb = ", c.partition_mb(),
                     " is out of range [0, 1048576] MiB (0: whole buckets)"));
  }
  if (c.spin_us() > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spin_us = ", c.spin_us(), " is above 1000000 (one second)"));
  }
  if (c.max_local_world_size() > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_local_world_size = ", c.max_local_world_size(),
                     " is above 65536"));
  }
  if (c.rendezvous().port() > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous.port = ", c.rendezvous().port(), " is above 65535"));
  }
  RETURN_IF_ERROR(ValidateRendezvousLimits(c.rendezvous().limits()));
  RETURN_IF_ERROR(
      ValidateCommHookSpec(c.default_comm_hook(), "default_comm_hook"));
  if (absl::Status level = ValidateLogLevel(c.log_level()); !level.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("log_level: ", level.message()));
  }
  if (const std::string& a = c.metrics().listen_address(); !a.empty()) {
    absl::Status address = ValidateListenAddress(a);
    if (!address.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metrics.listen_address '", a, "': ", address.message()));
    }
  }
  if (c.stall_shutdown_ms() != 0 && c.stall_warning_ms() != 0 &&
      c.stall_shutdown_ms() < c.stall_warning_ms()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stall_shutdown_ms = ", c.stall_shutdown_ms(),
                     " is below stall_warning_ms = ", c.stall_warning_ms(),
                     ": a stall is reported before it fails the job (set "
                     "stall_warning_ms lower, or 0 to only fail)"));
  }
  if (c.rank_restart_grace_ms() > kMaxRankRestartGraceMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank_restart_grace_ms = ", c.rank_restart_grace_ms(), " is above ",
        kMaxRankRestartGraceMs,
        " (one hour): a job would hold its ranks and memory that long for a "
        "trainer that may never come back"));
  }
  if (c.min_nodes() > kMaxMinNodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_nodes = ", c.min_nodes(), " is above ", kMaxMinNodes,
                     " (0 = a multi-node job needs all of its nodes)"));
  }
  if (c.rendezvous().reformation_settle_ms() > kMaxReformationSettleMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous.reformation_settle_ms = ",
        c.rendezvous().reformation_settle_ms(), " is above ",
        kMaxReformationSettleMs,
        " (ten minutes): every node of an elastic job would wait that long "
        "for a lost node at each re-formation"));
  }
  if (c.rendezvous().reformation_silence_ms() < kMinReformationSilenceMs ||
      c.rendezvous().reformation_silence_ms() > kMaxReformationSettleMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous.reformation_silence_ms = ",
        c.rendezvous().reformation_silence_ms(), " is outside ",
        kMinReformationSilenceMs, "..", kMaxReformationSettleMs,
        ": nodes beat every 200 ms, so a shorter silence would take live "
        "nodes for gone"));
  }
  if (absl::Status s = ValidateRendezvousBackend(c.rendezvous()); !s.ok()) {
    return s;
  }
  if (c.timeline_events() > kMaxTimelineEvents) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeline_events = ", c.timeline_events(), " is above ",
                     kMaxTimelineEvents));
  }
  return absl::OkStatus();
}

absl::Status ValidateListenAddress(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        "expected host:port (e.g. 0.0.0.0:9464 or [::1]:9464)");
  }
  absl::string_view host = address.substr(0, colon);
  const absl::string_view port = address.substr(colon + 1);
  uint32_t p = 0;
  if (port.empty() || !absl::SimpleAtoi(port, &p) || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "port '", port, "' is not a number in 0..65535 (0: OS-chosen)"));
  }
  if (absl::StartsWith(host, "[")) {
    if (!absl::EndsWith(host, "]") || host.size() < 3) {
      return absl::InvalidArgumentError(
          "an IPv6 host must be written in brackets, e.g. [::1]:9464");
    }
    host = host.substr(1, host.size() - 2);
    if (host.find_first_not_of("0123456789abcdefABCDEF:.") !=
        absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", host, "' is not an IPv6 address"));
    }
    return absl::OkStatus();
  }
  if (host.empty()) return absl::OkStatus();  // ":port": every interface
  if (host.find(':') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        "an IPv6 host must be written in brackets, e.g. [::1]:9464");
  }
  for (const char ch : host) {
    if (!absl::ascii_isalnum(ch) && ch != '.' && ch != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("'", host, "' is not a host name or IPv4 address"));
    }
  }
  return absl::OkStatus();
}

v1::DaemonConfig DefaultConfig() {
  v1::DaemonConfig config;
  ApplyConfigDefaults(&config);
  return config;
}

std::string ConfigToText(const v1::DaemonConfig& config) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(config, &out, options)
           .ok()) {
    return config.ShortDebugString();
  }
  return out;
}

}  // namespace gradd
