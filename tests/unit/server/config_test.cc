#include "server/config.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(ConfigTest, EmptyTextGivesDefaults) {
  absl::StatusOr<v1::DaemonConfig> c = ParseConfigYaml("", "empty.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  ApplyConfigDefaults(&*c);
  EXPECT_TRUE(ValidateConfig(*c).ok());
  EXPECT_EQ(c->bucket_cap_mb(), 25);
  EXPECT_EQ(c->first_bucket_cap_mb(), 1);
  EXPECT_EQ(c->attach_timeout_ms(), 60000u);
  EXPECT_EQ(c->max_jobs(), 64u);
  EXPECT_EQ(c->max_params(), 100000u);
  EXPECT_EQ(c->max_job_memory_bytes(), uint64_t{64} << 30);
  EXPECT_EQ(c->max_local_world_size(), 256u);
  EXPECT_EQ(c->spin_us(), 50u);
  EXPECT_GE(c->reduce_threads(), 1u);
  EXPECT_FALSE(c->node_id().empty());
  EXPECT_FALSE(c->socket_path().empty());
  EXPECT_EQ(c->rendezvous().formation_timeout_ms(), 60000u);
  EXPECT_EQ(c->rendezvous().collective_timeout_ms(), 30000u);
  // Neither torchrun's rendezvous port (29400) nor torch's store (29500).
  EXPECT_EQ(c->rendezvous().port(), 29600u);
  // Node loss and arrival: not elastic by default; 3 s of settling.
  EXPECT_EQ(c->min_nodes(), 0u);
  EXPECT_EQ(c->rendezvous().reformation_settle_ms(), 3000u);
  EXPECT_EQ(c->rendezvous().reformation_silence_ms(), 1000u);
}

TEST(ConfigTest, ElasticSettingsAreParsedAndBounded) {
  absl::StatusOr<v1::DaemonConfig> c = ParseConfigYaml(
      "min_nodes: 2\nrendezvous:\n  reformation_settle_ms: 500\n", "e.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  ApplyConfigDefaults(&*c);
  EXPECT_TRUE(ValidateConfig(*c).ok());
  EXPECT_EQ(c->min_nodes(), 2u);
  EXPECT_EQ(c->rendezvous().reformation_settle_ms(),
            500u);  // kept, not defaulted
  c->mutable_rendezvous()->set_reformation_settle_ms(600001);
  EXPECT_THAT(Message(ValidateConfig(*c)),
              HasSubstr("rendezvous.reformation_settle_ms = 600001 is above "
                        "600000"));
  c->mutable_rendezvous()->set_reformation_settle_ms(3000);
  for (uint32_t bad : {399u, 600001u}) {
    c->mutable_rendezvous()->set_reformation_silence_ms(bad);
    EXPECT_THAT(Message(ValidateConfig(*c)),
                HasSubstr(absl::StrCat("rendezvous.reformation_silence_ms = ",
                                       bad, " is outside 400..600000")));
  }
  c->mutable_rendezvous()->set_reformation_silence_ms(400);
  EXPECT_TRUE(ValidateConfig(*c).ok());
  c->set_min_nodes(65537);
  EXPECT_THAT(Message(ValidateConfig(*c)),
              HasSubstr("min_nodes = 65537 is above 65536"));
}

TEST(ConfigTest, InterfaceDefaultsToGraddSocketIfname) {
  ASSERT_EQ(setenv("GRADD_SOCKET_IFNAME", "eth7", 1), 0);
  v1::DaemonConfig from_env = DefaultConfig();
  absl::StatusOr<v1::DaemonConfig> configured =
      ParseConfigYaml("rendezvous:\n  interface: eth1\n", "i.yaml");
  ASSERT_TRUE(configured.ok());
  ApplyConfigDefaults(&*configured);
  unsetenv("GRADD_SOCKET_IFNAME");
  EXPECT_EQ(from_env.rendezvous().interface(), "eth7");
  EXPECT_EQ(configured->rendezvous().interface(), "eth1");
  EXPECT_EQ(DefaultConfig().rendezvous().interface(), "");
}

TEST(ConfigTest, ParsesEveryKindOfField) {
  absl::StatusOr<v1::DaemonConfig> c = ParseConfigYaml(R"(
socket_path: /tmp/g/gradd.sock
bucket_cap_mb: 12.5
reduce_threads: 3
max_job_memory_bytes: 1099511627776
node_id: 42
rendezvous:
  coordinator_address: "10.0.0.1:29400"
  formation_timeout_ms: 5000
metrics:
  listen_address: ":9400"
)",
                                                       "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  ApplyConfigDefaults(&*c);
  EXPECT_EQ(c->socket_path(), "/tmp/g/gradd.sock");
  EXPECT_EQ(c->bucket_cap_mb(), 12.5);
  EXPECT_EQ(c->first_bucket_cap_mb(), 1);  // default kept
  EXPECT_EQ(c->reduce_threads(), 3u);
  EXPECT_EQ(c->max_job_memory_bytes(), uint64_t{1} << 40);
  EXPECT_EQ(c->node_id(), "42");  // a number where a string is expected
  EXPECT_EQ(c->rendezvous().coordinator_address(), "10.0.0.1:29400");
  EXPECT_EQ(c->rendezvous().formation_timeout_ms(), 5000u);
  EXPECT_EQ(c->rendezvous().collective_timeout_ms(), 30000u);
  EXPECT_EQ(c->metrics().listen_address(), ":9400");
}

// Keys renamed to the engine's glossary (server/engine/README.md) keep
// working for one release: each use is reported (LoadConfigFile logs it as
// a warning) naming the file, line, old key and new key; setting both the
// old and the new name is an error; the new names report nothing.
TEST(ConfigTest, DeprecatedKeysStillWorkAndSaySo) {
  std::vector<std::string> notes;
  absl::StatusOr<v1::DaemonConfig> c = ParseConfigYaml(
      "rendezvous:\n  join_timeout_ms: 5000\n  reform_settle_ms: 700\n"
      "  reform_silence_ms: 600\n",
      "old.yaml", &notes);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rendezvous().formation_timeout_ms(), 5000u);
  EXPECT_EQ(c->rendezvous().reformation_settle_ms(), 700u);
  EXPECT_EQ(c->rendezvous().reformation_silence_ms(), 600u);
  ASSERT_EQ(notes.size(), 3u);
  EXPECT_THAT(notes[0],
              HasSubstr("old.yaml:2: key 'rendezvous.join_timeout_ms'"));
  EXPECT_THAT(notes[0], HasSubstr("deprecated"));
  EXPECT_THAT(notes[0], HasSubstr("use rendezvous.formation_timeout_ms"));
  EXPECT_THAT(notes[1], HasSubstr("use rendezvous.reformation_settle_ms"));
  EXPECT_THAT(notes[2], HasSubstr("use rendezvous.reformation_silence_ms"));

  notes.clear();
  c = ParseConfigYaml(
      "rendezvous:\n  formation_timeout_ms: 5000\n"
      "  reformation_settle_ms: 700\n  reformation_silence_ms: 600\n",
      "new.yaml", &notes);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(notes.empty());

  c = ParseConfigYaml(
      "rendezvous:\n  formation_timeout_ms: 5000\n  join_timeout_ms: 6000\n",
      "both.yaml", &notes);
  EXPECT_THAT(
      Message(c.status()),
      HasSubstr("both.yaml:3: key 'rendezvous.join_timeout_ms' sets "
                "the same setting as 'rendezvous.formation_timeout_ms'"));
  // An old name is only known where it was: not at the top level.
  EXPECT_THAT(
      Message(ParseConfigYaml("join_timeout_ms: 1\n", "top.yaml").status()),
      HasSubstr("is not a known setting"));
  c = ParseConfigYaml("spin_us: 10\nspin_us: 20\n", "twice.yaml");
  EXPECT_THAT(Message(c.status()), HasSubstr("key 'spin_us' is set twice"));
}

TEST(ConfigTest, UnknownKeyNamesKeyFileAndLine) {
  absl::StatusOr<v1::DaemonConfig> c =
      ParseConfigYaml("spin_us: 10\nbucket_cap: 5\n", "/etc/gradd.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(c.status()),
              AllOf(HasSubstr("/etc/gradd.yaml:2"),
                    HasSubstr("key 'bucket_cap' is not a known setting"),
                    HasSubstr("bucket_cap_mb")));
}

TEST(ConfigTest, UnknownNestedKeyIsDotted) {
  absl::StatusOr<v1::DaemonConfig> c =
      ParseConfigYaml("rendezvous:\n  join_timeout: 5\n", "x.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()),
              HasSubstr("key 'rendezvous.join_timeout' is not a known"));
}

TEST(ConfigTest, BadValuesAreRejected) {
  struct Case {
    const char* yaml;
    const char* expect;
  } cases[] = {
      {"max_jobs: -1", "key 'max_jobs': '-1' is not a non-negative integer"},
      {"max_jobs: lots", "'lots' is not a non-negative integer"},
      {"max_jobs: 4294967296", "below 2^32"},
      {"bucket_cap_mb: fast", "'fast' is not a finite number or 'auto'"},
      {"first_bucket_cap_mb: auto", "'auto' is not a finite number"},
      {"bucket_cap_mb: Auto", "'Auto' is not a finite number or 'auto'"},
      {"bucket_cap_mb: .nan", "is not a finite number"},
      {"rendezvous: 5", "key 'rendezvous': expected a map"},
      {"spin_us: [1, 2]", "expected a uint32 value"},
      {"- a\n- b", "the top level must be a map"},
      {"a: [unclosed", "invalid YAML"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<v1::DaemonConfig> r = ParseConfigYaml(c.yaml, "bad.yaml");
    ASSERT_FALSE(r.ok()) << c.yaml;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_THAT(Message(r.status()), HasSubstr(c.expect)) << c.yaml;
  }
}

// Issue 36 point 4: `bucket_cap_mb: auto` switches autotune on and
// leaves the cap (the one before the bucket rebuild) at its default.
TEST(ConfigTest, BucketCapAuto) {
  absl::StatusOr<v1::DaemonConfig> c = ParseConfigYaml(
      "bucket_cap_mb: auto\nautotune_caps_mb: '2, 8,32'\n", "auto.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->bucket_cap_auto());
  ApplyConfigDefaults(&*c);
  EXPECT_EQ(c->bucket_cap_mb(), 25);
  EXPECT_TRUE(ValidateConfig(*c).ok());
  absl::StatusOr<std::vector<double>> caps =
      ParseAutotuneCaps(c->autotune_caps_mb());
  ASSERT_TRUE(caps.ok()) << caps.status();
  EXPECT_EQ(*caps, (std::vector<double>{2, 8, 32}));
  EXPECT_EQ(*ParseAutotuneCaps(""), (std::vector<double>{1, 4, 10, 25, 64}));
  absl::StatusOr<v1::DaemonConfig> plain =
      ParseConfigYaml("bucket_cap_mb: 10", "plain.yaml");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->bucket_cap_auto());

  v1::DaemonConfig bad = DefaultConfig();
  bad.set_autotune_caps_mb("1,x,4");
  EXPECT_THAT(Message(ValidateConfig(bad)),
              HasSubstr("autotune_caps_mb = '1,x,4': 'x' is not a size"));
  bad.set_autotune_caps_mb("1,0");
  EXPECT_THAT(Message(ValidateConfig(bad)), HasSubstr("'0' is not a size"));
  bad = DefaultConfig();
  bad.set_autotune_partitions_mb("0,-1");
  EXPECT_THAT(Message(ValidateConfig(bad)),
              HasSubstr("autotune_partitions_mb = '0,-1': '-1' is not a size "
                        "in [0, 1048576] MiB"));
  EXPECT_TRUE(ParseAutotunePartitions("")->empty());
  EXPECT_EQ(*ParseAutotunePartitions("0, 1,4"), (std::vector<double>{0, 1, 4}));
  bad.set_autotune_caps_mb("1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1");
  EXPECT_THAT(Message(ValidateConfig(bad)), HasSubstr("at most 16"));
  bad = DefaultConfig();
  bad.set_autotune_measured_iterations(5000);
  EXPECT_THAT(Message(ValidateConfig(bad)),
              HasSubstr("autotune_measured_iterations = 5000 is above 1000"));
}

TEST(ConfigTest, ValidationCatchesOutOfRangeValues) {
  v1::DaemonConfig c = DefaultConfig();
  c.set_bucket_cap_mb(-2);
  EXPECT_THAT(Message(ValidateConfig(c)),
              HasSubstr("bucket_cap_mb = -2 is out of range"));
  c = DefaultConfig();
  c.set_socket_path("relative.sock");
  EXPECT_THAT(Message(ValidateConfig(c)), HasSubstr("absolute path"));
  c = DefaultConfig();
  c.set_socket_path("/" + std::string(120, 'x'));
  EXPECT_THAT(Message(ValidateConfig(c)), HasSubstr("limited to"));
  c = DefaultConfig();
  c.set_spin_us(5000000);
  EXPECT_THAT(Message(ValidateConfig(c)), HasSubstr("spin_us"));
  c = DefaultConfig();
  c.mutable_rendezvous()->set_port(70000);
  EXPECT_THAT(Message(ValidateConfig(c)), HasSubstr("rendezvous.port = 70000"));
}

TEST(ConfigTest, LogLevelDefaultsToInfoAndIsChecked) {
  EXPECT_EQ(DefaultConfig().log_level(), "info");
  absl::StatusOr<v1::DaemonConfig> c =
      ParseConfigYaml("log_level: warning\n", "log.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->log_level(), "warning");
  v1::DaemonConfig d = DefaultConfig();
  d.set_log_level("warning");
  EXPECT_TRUE(ValidateConfig(d).ok());
  d.set_log_level("loud");
  EXPECT_THAT(
      Message(ValidateConfig(d)),
      AllOf(HasSubstr("log_level"), HasSubstr("'loud'"), HasSubstr("warning")));
}

TEST(ConfigTest, SchedulingAndPartitionDefaultAndAreChecked) {
  const v1::DaemonConfig defaults = DefaultConfig();
  EXPECT_EQ(defaults.scheduling(), "priority");
  EXPECT_TRUE(defaults.has_partition_mb());
  absl::StatusOr<v1::DaemonConfig> c =
      ParseConfigYaml("scheduling: none\npartition_mb: 0\n", "sched.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scheduling(), "none");
  // 0 (whole buckets) is a value, not "unset": the default does not
  // replace it.
  ApplyConfigDefaults(&*c);
  EXPECT_TRUE(c->has_partition_mb());
  EXPECT_EQ(c->partition_mb(), 0);
  EXPECT_TRUE(ValidateConfig(*c).ok());
  v1::DaemonConfig d = DefaultConfig();
  d.set_scheduling("fifo");
  EXPECT_THAT(Message(ValidateConfig(d)),
              AllOf(HasSubstr("scheduling"), HasSubstr("'fifo'"),
                    HasSubstr("priority"), HasSubstr("none")));
  d = DefaultConfig();
  d.set_partition_mb(-1);
  EXPECT_THAT(Message(ValidateConfig(d)), HasSubstr("partition_mb = -1"));
}

TEST(ConfigTest, DefaultCommHookIsParsedAndChecked) {
  absl::StatusOr<v1::DaemonConfig> c = ParseConfigYaml(R"(
default_comm_hook:
  name: powerSGD
  matrix_approximation_rank: 2
  start_powersgd_iter: 10
  warm_start: false
)",
                                                       "hook.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->default_comm_hook().name(), "powerSGD");
  EXPECT_EQ(c->default_comm_hook().matrix_approximation_rank(), 2);
  EXPECT_EQ(c->default_comm_hook().start_powersgd_iter(), 10);
  ASSERT_TRUE(c->default_comm_hook().has_warm_start());
  EXPECT_FALSE(c->default_comm_hook().warm_start());
  v1::DaemonConfig good = DefaultConfig();
  *good.mutable_default_comm_hook() = c->default_comm_hook();
  EXPECT_TRUE(ValidateConfig(good).ok()) << ValidateConfig(good);
  v1::DaemonConfig bad = DefaultConfig();
  bad.mutable_default_comm_hook()->set_name("fp8_compress");
  EXPECT_THAT(Message(ValidateConfig(bad)),
              HasSubstr("default_comm_hook: unknown communication hook "
                        "'fp8_compress'"));
}

TEST(ConfigTest, LoadConfigFileAppliesDefaultsAndNamesTheFile) {
  char path[] = "/tmp/gradd-config-test-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  { std::ofstream(path) << "max_jobs: 7\nfirst_bucket_cap_mb: 0\n"; }
  absl::StatusOr<v1::DaemonConfig> c = LoadConfigFile(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_jobs(), 7u);
  EXPECT_EQ(c->first_bucket_cap_mb(), 1);  // explicit 0 = default
  { std::ofstream(path) << "bucket_cap_mb: -1\n"; }
  c = LoadConfigFile(path);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()),
              AllOf(HasSubstr(path), HasSubstr("bucket_cap_mb")));
  unlink(path);
  c = LoadConfigFile(path);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(c.status()), HasSubstr(path));
}

TEST(ConfigTest, StallAndTimelineDefaultsAndZeroMeansOff) {
  absl::StatusOr<v1::DaemonConfig> c = ParseConfigYaml("", "empty.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  ApplyConfigDefaults(&*c);
  EXPECT_EQ(c->stall_warning_ms(), 10000u);
  EXPECT_EQ(c->stall_shutdown_ms(), 0u);
  EXPECT_EQ(c->timeline_events(), 16384u);

  // An explicit 0 turns the warning off instead of meaning "default".
  c = ParseConfigYaml("stall_warning_ms: 0\nstall_shutdown_ms: 5000\n", "t");
  ASSERT_TRUE(c.ok()) << c.status();
  ApplyConfigDefaults(&*c);
  EXPECT_EQ(c->stall_warning_ms(), 0u);
  EXPECT_EQ(c->stall_shutdown_ms(), 5000u);
  EXPECT_TRUE(ValidateConfig(*c).ok());
}

TEST(ConfigTest, StallShutdownBelowWarningIsRejected) {
  v1::DaemonConfig c = DefaultConfig();
  c.set_stall_warning_ms(5000);
  c.set_stall_shutdown_ms(1000);
  const absl::Status s = ValidateConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), AllOf(HasSubstr("stall_shutdown_ms = 1000"),
                                HasSubstr("stall_warning_ms = 5000")));
  c.set_stall_shutdown_ms(5000);
  EXPECT_TRUE(ValidateConfig(c).ok());
  c.set_timeline_events(1u << 30);
  EXPECT_THAT(Message(ValidateConfig(c)), HasSubstr("timeline_events"));
}

TEST(ConfigTest, NiceDefaultsToMinusTenAndIsChecked) {
  auto c = ParseConfigYaml("", "t");
  ASSERT_TRUE(c.ok());
  ApplyConfigDefaults(&*c);
  EXPECT_EQ(c->nice(), -10);
  // An explicit 0 is kept (the niceness the daemon was started with).
  c = ParseConfigYaml("nice: 0\n", "t");
  ASSERT_TRUE(c.ok()) << c.status();
  ApplyConfigDefaults(&*c);
  EXPECT_EQ(c->nice(), 0);
  EXPECT_TRUE(ValidateConfig(*c).ok());
  for (int bad : {-21, 20}) {
    c->set_nice(bad);
    EXPECT_THAT(Message(ValidateConfig(*c)),
                HasSubstr(absl::StrCat("nice = ", bad, " is outside")));
  }
}

TEST(ConfigTest, MetricsListenAddressIsChecked) {
  v1::DaemonConfig c = DefaultConfig();
  for (const char* good : {"0.0.0.0:9464", "127.0.0.1:0", ":9464",
                           "localhost:9464", "[::1]:9464"}) {
    c.mutable_metrics()->set_listen_address(good);
    EXPECT_TRUE(ValidateConfig(c).ok()) << good;
  }
  for (const auto& [bad, why] :
       std::vector<std::pair<const char*, const char*>>{
           {"9464", "expected host:port"},
           {"0.0.0.0:", "is not a number"},
           {"0.0.0.0:99999", "'99999' is not a number in 0..65535"},
           {"host name:80", "not a host name"},
           {"::1:9464", "brackets"},
           {"[::1:9464", "brackets"}}) {
    c.mutable_metrics()->set_listen_address(bad);
    const absl::Status s = ValidateConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(Message(s), AllOf(HasSubstr("metrics.listen_address"),
                                  HasSubstr(bad), HasSubstr(why)));
  }
}

TEST(ConfigTest, ConfigToTextRoundTrips) {
  v1::DaemonConfig c = DefaultConfig();
  c.set_max_jobs(9);
  absl::StatusOr<v1::DaemonConfig> back =
      ParseConfigYaml(ConfigToText(c), "printed");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << ConfigToText(c);
  EXPECT_EQ(back->max_jobs(), 9u);
  EXPECT_EQ(back->socket_path(), c.socket_path());
}

}  // namespace
}  // namespace gradd

namespace gradd {
namespace {

// Issue 20: a daemon configured to talk to other daemons must say how it
// proves who it is, or say explicitly that it does not.
TEST(ConfigSecurityTest, AMultiNodeDaemonNeedsCredentialsOrInsecure) {
  for (const char* key :
       {"coordinator_address", "listen_address", "expected_node_ids"}) {
    v1::DaemonConfig c = DefaultConfig();
    v1::RendezvousConfig* rv = c.mutable_rendezvous();
    const auto* field = rv->GetDescriptor()->FindFieldByName(key);
    rv->GetReflection()->SetString(rv, field, "node-a:29600");
    const absl::Status s = ValidateNodeSecurity(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_THAT(
        Message(s),
        AllOf(HasSubstr(
                  absl::StrCat("rendezvous.", key, " makes this a multi-node")),
              HasSubstr("rendezvous.token_file"), HasSubstr("rendezvous.tls"),
              HasSubstr("rendezvous.insecure: true")));
    v1::DaemonConfig insecure = c;
    insecure.mutable_rendezvous()->set_insecure(true);
    EXPECT_TRUE(ValidateNodeSecurity(insecure).ok()) << key;
    v1::DaemonConfig token = c;
    token.mutable_rendezvous()->set_token_file("/run/credentials/gradd/token");
    EXPECT_TRUE(ValidateNodeSecurity(token).ok()) << key;
    v1::DaemonConfig tls = c;
    tls.mutable_rendezvous()->mutable_tls()->set_cert_file("/c");
    EXPECT_TRUE(ValidateNodeSecurity(tls).ok()) << key;
  }
  // Single-node use needs nothing.
  EXPECT_TRUE(ValidateNodeSecurity(DefaultConfig()).ok());
  // The rest of the config is checked without it: a file may leave the
  // credentials to flags.
  v1::DaemonConfig file = DefaultConfig();
  file.mutable_rendezvous()->set_listen_address("0.0.0.0:29600");
  EXPECT_TRUE(ValidateConfig(file).ok());
  EXPECT_FALSE(ValidateNodeSecurity(file).ok());
  // Both at once is a contradiction, not a fallback.
  v1::DaemonConfig both = DefaultConfig();
  both.mutable_rendezvous()->set_insecure(true);
  both.mutable_rendezvous()->set_token_file("/t");
  EXPECT_THAT(Message(ValidateNodeSecurity(both)),
              HasSubstr("rendezvous.insecure: true contradicts"));
}

TEST(ConfigSecurityTest, CredentialKeysParseFromYaml) {
  absl::StatusOr<v1::DaemonConfig> c = ParseConfigYaml(R"(
rendezvous:
  listen_address: "0.0.0.0:29600"
  token_file: /run/credentials/gradd.service/gradd-token
  tls:
    cert_file: /etc/gradd/tls/node.crt
    key_file: /etc/gradd/tls/node.key
    ca_file: /etc/gradd/tls/ca.crt
    server_name: gradd
  limits:
    max_value_bytes: 1048576
    max_rounds_per_job_per_minute: 10
)",
                                                       "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  ApplyConfigDefaults(&*c);
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);
  EXPECT_TRUE(ValidateNodeSecurity(*c).ok()) << ValidateNodeSecurity(*c);
  const v1::RendezvousConfig& rv = c->rendezvous();
  EXPECT_EQ(rv.tls().server_name(), "gradd");
  EXPECT_EQ(rv.tls().ca_file(), "/etc/gradd/tls/ca.crt");
  EXPECT_EQ(rv.limits().max_value_bytes(), 1048576u);
  EXPECT_EQ(rv.limits().max_rounds_per_job_per_minute(), 10u);
  EXPECT_FALSE(rv.insecure());
}

TEST(ConfigSecurityTest, StoreLimitsHaveDefaultsAndAreChecked) {
  v1::DaemonConfig c = DefaultConfig();
  const v1::RendezvousLimits& l = c.rendezvous().limits();
  EXPECT_EQ(l.max_key_bytes(), 1024u);
  EXPECT_EQ(l.max_value_bytes(), uint64_t{32} << 20);
  EXPECT_EQ(l.max_keys_per_job(), 65536u);
  EXPECT_EQ(l.max_job_bytes(), uint64_t{512} << 20);
  EXPECT_EQ(l.max_total_bytes(), uint64_t{1} << 30);
  EXPECT_EQ(l.max_rounds_per_job_per_minute(), 60u);
  EXPECT_EQ(l.job_ttl_s(), 86400u);
  v1::DaemonConfig bad = c;
  bad.mutable_rendezvous()->mutable_limits()->set_max_job_bytes(1000);
  EXPECT_THAT(Message(ValidateConfig(bad)),
              HasSubstr("rendezvous.limits.max_job_bytes = 1000 is below "
                        "max_value_bytes"));
  bad = c;
  bad.mutable_rendezvous()->mutable_limits()->set_max_total_bytes(1 << 20);
  EXPECT_THAT(Message(ValidateConfig(bad)),
              HasSubstr("rendezvous.limits.max_total_bytes"));
  bad = c;
  bad.mutable_rendezvous()->mutable_limits()->set_max_value_bytes(uint64_t{4}
                                                                  << 30);
  EXPECT_THAT(Message(ValidateConfig(bad)),
              HasSubstr("rendezvous.limits.max_value_bytes"));
}

// rendezvous.backend and rendezvous.etcd (issue 34).
absl::StatusOr<v1::DaemonConfig> EtcdConfig(const std::string& etcd_lines) {
  absl::StatusOr<v1::DaemonConfig> c = ParseConfigYaml(
      absl::StrCat("rendezvous:\n  backend: etcd\n  etcd:\n", etcd_lines),
      "etcd.yaml");
  if (c.ok()) ApplyConfigDefaults(&*c);
  return c;
}

TEST(ConfigEtcdTest, BuiltinIsTheDefaultAndEtcdGetsItsDefaults) {
  v1::DaemonConfig builtin = DefaultConfig();
  EXPECT_EQ(builtin.rendezvous().backend(), "builtin");
  // Nothing of the etcd section is filled in for the built-in store.
  EXPECT_EQ(builtin.rendezvous().etcd().prefix(), "");
  EXPECT_EQ(builtin.rendezvous().etcd().lease_ttl_ms(), 0u);
  EXPECT_TRUE(ValidateConfig(builtin).ok());

  absl::StatusOr<v1::DaemonConfig> c =
      EtcdConfig("    endpoints: 10.0.0.1:2379, 10.0.0.2:2379\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);
  const v1::RendezvousEtcdConfig& e = c->rendezvous().etcd();
  EXPECT_EQ(e.endpoints(), "10.0.0.1:2379, 10.0.0.2:2379");
  EXPECT_EQ(e.prefix(), "/gradd/");
  // The built-in store's job TTL (rendezvous.limits.job_ttl_s), in ms.
  EXPECT_EQ(e.lease_ttl_ms(), 10000u);
  EXPECT_TRUE(e.ca_file().empty());
  EXPECT_TRUE(e.user().empty());
  // Set values are kept; the lease TTL does not follow job_ttl_s (the
  // lease carries only liveness keys now).
  absl::StatusOr<v1::DaemonConfig> set = ParseConfigYaml(R"(
rendezvous:
  backend: etcd
  limits:
    job_ttl_s: 120
  etcd:
    endpoints: https://etcd-0.etcd:2379
    prefix: /cluster-b/
)",
                                                         "set.yaml");
  ASSERT_TRUE(set.ok()) << set.status();
  ApplyConfigDefaults(&*set);
  EXPECT_TRUE(ValidateConfig(*set).ok()) << ValidateConfig(*set);
  EXPECT_EQ(set->rendezvous().etcd().prefix(), "/cluster-b/");
  EXPECT_EQ(set->rendezvous().etcd().lease_ttl_ms(), 10000u);
  // --print_config shows the section and it reads back the same.
  const std::string text = ConfigToText(*set);
  EXPECT_THAT(text,
              AllOf(HasSubstr("\"backend\": \"etcd\""),
                    HasSubstr("\"endpoints\": \"https://etcd-0.etcd:2379\""),
                    HasSubstr("\"prefix\": \"/cluster-b/\"")));
  absl::StatusOr<v1::DaemonConfig> again = ParseConfigYaml(text, "again.yaml");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << text;
  EXPECT_EQ(again->rendezvous().etcd().SerializeAsString(),
            set->rendezvous().etcd().SerializeAsString());
}

TEST(ConfigEtcdTest, AnUnknownBackendIsRefusedNamingTheChoices) {
  for (const char* backend : {"Etcd", "consul", "etcd3", " etcd"}) {
    v1::DaemonConfig c = DefaultConfig();
    c.mutable_rendezvous()->set_backend(backend);
    c.mutable_rendezvous()->mutable_etcd()->set_endpoints("127.0.0.1:2379");
    const absl::Status s = ValidateConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << backend;
    EXPECT_THAT(
        Message(s),
        AllOf(HasSubstr(absl::StrCat("rendezvous.backend = '", backend, "'")),
              HasSubstr("builtin"), HasSubstr("etcd")))
        << backend;
  }
}

TEST(ConfigEtcdTest, EndpointsAreRequiredAndOnlyWithTheEtcdBackend) {
  for (const char* endpoints : {"", "   ", " , "}) {
    absl::StatusOr<v1::DaemonConfig> c =
        EtcdConfig(absl::StrCat("    endpoints: \"", endpoints, "\"\n"));
    ASSERT_TRUE(c.ok()) << c.status();
    const absl::Status s = ValidateConfig(*c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
        << "'" << endpoints << "'";
    EXPECT_THAT(Message(s), HasSubstr("rendezvous.etcd.endpoints"))
        << "'" << endpoints << "'";
  }
  // backend etcd without any etcd section at all.
  absl::StatusOr<v1::DaemonConfig> bare =
      ParseConfigYaml("rendezvous:\n  backend: etcd\n", "bare.yaml");
  ASSERT_TRUE(bare.ok()) << bare.status();
  ApplyConfigDefaults(&*bare);
  EXPECT_THAT(Message(ValidateConfig(*bare)),
              HasSubstr("rendezvous.backend: etcd needs "
                        "rendezvous.etcd.endpoints"));
  // Endpoints with the built-in store are a mistake, not ignored.
  v1::DaemonConfig builtin = DefaultConfig();
  builtin.mutable_rendezvous()->mutable_etcd()->set_endpoints("h:2379");
  EXPECT_THAT(Message(ValidateConfig(builtin)),
              AllOf(HasSubstr("rendezvous.etcd.endpoints is set"),
                    HasSubstr("rendezvous.backend: etcd")));
  // No coordinator on etcd.
  for (const char* key : {"coordinator_address", "listen_address"}) {
    absl::StatusOr<v1::DaemonConfig> c = EtcdConfig("    endpoints: h:2379\n");
    ASSERT_TRUE(c.ok());
    v1::RendezvousConfig* rv = c->mutable_rendezvous();
    rv->GetReflection()->SetString(
        rv, rv->GetDescriptor()->FindFieldByName(key), "node-a:29600");
    EXPECT_THAT(Message(ValidateConfig(*c)),
                AllOf(HasSubstr("has no coordinator"),
                      HasSubstr(absl::StrCat("rendezvous.", key))))
        << key;
  }
}

TEST(ConfigEtcdTest, MalformedEndpointsAreRefusedNamingTheKeyAndTheEntry) {
  for (const char* good :
       {"127.0.0.1:2379", "etcd-0.etcd.svc:2379,etcd-1.etcd.svc:2379",
        "http://10.0.0.1:2379", "https://10.0.0.1:2379/", "[::1]:2379"}) {
    absl::StatusOr<v1::DaemonConfig> c =
        EtcdConfig(absl::StrCat("    endpoints: \"", good, "\"\n"));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(ValidateConfig(*c).ok()) << good << ": " << ValidateConfig(*c);
  }
  for (const char* bad : {"etcd-0", "10.0.0.1:", "10.0.0.1:2379,etcd-1", "h:0",
                          "h:65536", "h:port", ":2379"}) {
    absl::StatusOr<v1::DaemonConfig> c =
        EtcdConfig(absl::StrCat("    endpoints: \"", bad, "\"\n"));
    ASSERT_TRUE(c.ok()) << c.status();
    const absl::Status s = ValidateConfig(*c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(Message(s), AllOf(HasSubstr("rendezvous.etcd.endpoints"),
                                  HasSubstr("host:port")))
        << bad;
  }
}

TEST(ConfigEtcdTest, LeaseTtlAndPrefixAreChecked) {
  absl::StatusOr<v1::DaemonConfig> c = EtcdConfig("    endpoints: h:2379\n");
  ASSERT_TRUE(c.ok()) << c.status();
  for (uint32_t ttl : {1u, 1000u, 1999u}) {
    v1::DaemonConfig bad = *c;
    bad.mutable_rendezvous()->mutable_etcd()->set_lease_ttl_ms(ttl);
    const absl::Status s = ValidateConfig(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << ttl;
    EXPECT_THAT(Message(s),
                AllOf(HasSubstr(absl::StrCat(
                    "rendezvous.etcd.lease_ttl_ms = ", ttl, " is below 2000"))))
        << ttl;
  }
  // 0 in a file means the default (the job TTL), not "no lease".
  absl::StatusOr<v1::DaemonConfig> zero =
      EtcdConfig("    endpoints: h:2379\n    lease_ttl_ms: 0\n");
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->rendezvous().etcd().lease_ttl_ms(), 10000u);
  v1::DaemonConfig least = *c;
  least.mutable_rendezvous()->mutable_etcd()->set_lease_ttl_ms(2000);
  EXPECT_TRUE(ValidateConfig(least).ok()) << ValidateConfig(least);
  // A negative or non-numeric TTL is a parse error naming the key.
  absl::StatusOr<v1::DaemonConfig> negative =
      EtcdConfig("    endpoints: h:2379\n    lease_ttl_ms: -5\n");
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(Message(negative.status()),
              HasSubstr("rendezvous.etcd.lease_ttl_ms"));

  for (const char* prefix : {"gradd/", "gradd"}) {
    v1::DaemonConfig bad = *c;
    bad.mutable_rendezvous()->mutable_etcd()->set_prefix(prefix);
    EXPECT_THAT(Message(ValidateConfig(bad)),
                HasSubstr(absl::StrCat("rendezvous.etcd.prefix = '", prefix,
                                       "': must start with '/'")));
  }
}

TEST(ConfigEtcdTest, ThePasswordComesFromAFileAndNeverInline) {
  // There is no key for an inline password.
  absl::StatusOr<v1::DaemonConfig> inline_pw = EtcdConfig(
      "    endpoints: h:2379\n    user: gradd\n    password: hunter2\n");
  ASSERT_FALSE(inline_pw.ok());
  EXPECT_THAT(Message(inline_pw.status()),
              HasSubstr("key 'rendezvous.etcd.password' is not a known"));
  EXPECT_THAT(Message(inline_pw.status()), Not(HasSubstr("hunter2")));
  // A user and its password file go together.
  absl::StatusOr<v1::DaemonConfig> user_only =
      EtcdConfig("    endpoints: h:2379\n    user: gradd\n");
  ASSERT_TRUE(user_only.ok());
  EXPECT_THAT(Message(ValidateConfig(*user_only)),
              HasSubstr("rendezvous.etcd.user and "
                        "rendezvous.etcd.password_file go together"));
  absl::StatusOr<v1::DaemonConfig> file_only = EtcdConfig(
      "    endpoints: h:2379\n    password_file: /run/secrets/etcd\n");
  ASSERT_TRUE(file_only.ok());
  EXPECT_THAT(Message(ValidateConfig(*file_only)),
              HasSubstr("rendezvous.etcd.user and "
                        "rendezvous.etcd.password_file go together"));
  absl::StatusOr<v1::DaemonConfig> both = EtcdConfig(
      "    endpoints: h:2379\n    user: gradd\n"
      "    password_file: /run/secrets/etcd\n");
  ASSERT_TRUE(both.ok());
  EXPECT_TRUE(ValidateConfig(*both).ok()) << ValidateConfig(*both);
  // The config names the file; its text is read at start, not here.
  EXPECT_THAT(ConfigToText(*both),
              HasSubstr("\"password_file\": \"/run/secrets/etcd\""));
}

TEST(ConfigEtcdTest, TlsFilesGoTogether) {
  struct Case {
    const char* lines;
    const char* error;  // nullptr: valid
  };
  const Case cases[] = {
      // TLS with the server checked, no client certificate.
      {"    ca_file: /e/ca.crt\n", nullptr},
      // Mutual TLS.
      {"    ca_file: /e/ca.crt\n    cert_file: /e/c.crt\n"
       "    key_file: /e/c.key\n",
       nullptr},
      {"    ca_file: /e/ca.crt\n    cert_file: /e/c.crt\n"
       "    key_file: /e/c.key\n    server_name: etcd.internal\n",
       nullptr},
      // Mutual TLS and a user.
      {"    ca_file: /e/ca.crt\n    cert_file: /e/c.crt\n"
       "    key_file: /e/c.key\n    user: u\n    password_file: /e/pw\n",
       nullptr},
      {"    ca_file: /e/ca.crt\n    cert_file: /e/c.crt\n",
       "rendezvous.etcd.cert_file and rendezvous.etcd.key_file go together"},
      {"    ca_file: /e/ca.crt\n    key_file: /e/c.key\n",
       "rendezvous.etcd.cert_file and rendezvous.etcd.key_file go together"},
      {"    cert_file: /e/c.crt\n    key_file: /e/c.key\n",
       "rendezvous.etcd.cert_file needs rendezvous.etcd.ca_file"},
  };
  for (const Case& k : cases) {
    absl::StatusOr<v1::DaemonConfig> c =
        EtcdConfig(absl::StrCat("    endpoints: h:2379\n", k.lines));
    ASSERT_TRUE(c.ok()) << c.status();
    const absl::Status s = ValidateConfig(*c);
    if (k.error == nullptr) {
      EXPECT_TRUE(s.ok()) << k.lines << s;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.lines;
      EXPECT_THAT(Message(s), HasSubstr(k.error)) << k.lines;
    }
  }
}

TEST(ConfigEtcdTest, EtcdIsMultiNodeSoTheDaemonsNeedCredentials) {
  absl::StatusOr<v1::DaemonConfig> c = EtcdConfig("    endpoints: h:2379\n");
  ASSERT_TRUE(c.ok()) << c.status();
  // etcd's own credentials do not secure the daemons' Gloo connections.
  c->mutable_rendezvous()->mutable_etcd()->set_ca_file("/e/ca.crt");
  const absl::Status s = ValidateNodeSecurity(*c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), AllOf(HasSubstr("rendezvous.backend: etcd"),
                                HasSubstr("rendezvous.token_file")));
  c->mutable_rendezvous()->set_token_file("/run/credentials/gradd/token");
  EXPECT_TRUE(ValidateNodeSecurity(*c).ok()) << ValidateNodeSecurity(*c);
}

}  // namespace
}  // namespace gradd
