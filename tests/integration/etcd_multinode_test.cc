// rendezvous.backend: etcd end to end (issue 34): real gradd daemons whose
// rendezvous store is a real etcd (Debian's etcd-server, started on
// loopback by etcd_cluster.h) form multi-node jobs of real trainer
// processes, which check every averaged value exactly; the same with the
// daemons reaching etcd over mutual TLS; and daemons whose etcd
// credentials are missing or wrong refusing to start with an error that
// names the endpoints and no secret; and what `graddctl status`, `graddctl
// job`, /metrics and the log of such a daemon show (the backend, its lease,
// each job's epoch), never a credential. No daemon is a coordinator here:
// no --rendezvous-listen, no --coordinator.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/etcd_cluster.h"
#include "tests/integration/harness.h"
#include "tests/integration/node_cluster.h"

namespace gradd::testing {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

using Clock = std::chrono::steady_clock;

// The body of GET http://127.0.0.1:<port>/metrics, or "" (with a failure).
std::string Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (fd < 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ADD_FAILURE() << "cannot connect to 127.0.0.1:" << port << ": "
                  << std::strerror(errno);
    if (fd >= 0) close(fd);
    return "";
  }
  const std::string request =
      "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, request.data(), request.size()) !=
      static_cast<ssize_t>(request.size())) {
    ADD_FAILURE() << "cannot send the scrape request";
  }
  std::string response;
  char buf[16384];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos ||
      response.find(" 200 ") == std::string::npos) {
    ADD_FAILURE() << "bad /metrics answer:\n" << response;
    return "";
  }
  return response.substr(body + 4);
}

// Each test starts the etcd it needs (plaintext, mutual TLS, with users, or
// none at all).
class EtcdMultiNodeTest : public NodeClusterTest {
 protected:
  EtcdMultiNodeTest()
      : NodeClusterTest(Backend::kEtcd, "gradd-etcd-mn-", std::nullopt) {}

  // The daemons' config: the etcd backend at the cluster's endpoints, with
  // `etcd_lines` (indented under rendezvous.etcd) for its credentials and
  // `top_lines` at the top level.
  std::string WriteConfig(const std::string& name,
                          const std::vector<std::string>& etcd_lines,
                          const std::vector<std::string>& top_lines = {}) {
    NodeConfig config;
    config.name = name;
    config.etcd_lines = etcd_lines;
    config.top_lines = top_lines;
    return WriteNodeConfig(config);
  }

  // graddctl `args` against node `id`'s daemon, bounded.
  Exit Ctl(const std::string& id, const std::vector<std::string>& args) {
#ifdef GRADDCTL_BINARY
    std::vector<std::string> argv = {GRADDCTL_BINARY, "--socket",
                                     Node(id).socket};
    argv.insert(argv.end(), args.begin(), args.end());
    Proc p = Spawn(absl::StrCat("graddctl.", ++ctl_runs_), argv);
    return Wait(p, milliseconds(20000));
#else
    ADD_FAILURE() << "graddctl not built";
    return Exit();
#endif
  }

  // Three daemons on `config` run a job of 6 ranks over uneven local
  // worlds (a: 2, b: 1, c: 3); every trainer checks every averaged value
  // against its closed form with world size 6.
  void ExpectThreeNodeJobAveragesExactly(const std::string& config,
                                         const std::string& job) {
    ASSERT_TRUE(StartNodes({"node-a", "node-b", "node-c"}, config));
    ASSERT_NO_FATAL_FAILURE(ExpectUnevenThreeNodeJobAveragesExactly(
        job, /*iterations=*/50, /*seed=*/11, /*min_buckets=*/4,
        milliseconds(90000)));
    // Every daemon used etcd, none served a store of its own.
    for (const NodeDaemon& d : daemons_) {
      const std::string log = ReadFile(d.proc.log);
      EXPECT_THAT(log, HasSubstr(absl::StrCat("rendezvous backend etcd at ",
                                              cluster_->endpoints()[0])))
          << d.node_id;
      EXPECT_THAT(log, Not(HasSubstr("PRIVATE KEY"))) << d.node_id;
    }
  }

  // A daemon with `config` must refuse to start: it exits non-zero within
  // `within` with an error naming the etcd endpoints. Its log.
  std::string ExpectDaemonRefusesToStart(const std::string& config,
                                         milliseconds within) {
    NodeDaemon d =
        SpawnNode("node-a", config, absl::StrCat("refused-", ++refused_));
    Exit e = Wait(d.proc, within);
    EXPECT_TRUE(e.code.has_value())
        << "still running after " << within.count() << " ms:\n"
        << e.output;
    EXPECT_NE(e.code.value_or(0), 0) << e.output;
    EXPECT_THAT(e.output, HasSubstr(cluster_->endpoints()[0]));
    EXPECT_THAT(e.output, Not(HasSubstr("PRIVATE KEY")));
    // The daemon's own last line (gRPC's TLS lines come before it).
    std::cout << "refused as expected (" << config << "): "
              << e.output.substr(e.output.rfind('\n', e.output.size() - 2) + 1);
    return e.output;
  }

  int refused_ = 0;
  int ctl_runs_ = 0;
};

TEST_F(EtcdMultiNodeTest, ThreeDaemonsOnEtcdAverageExactly) {
  ASSERT_NO_FATAL_FAILURE(StartEtcd(EtcdAuth::kPlaintext));
  const std::string config = WriteConfig("plain", {});
  ASSERT_NO_FATAL_FAILURE(ExpectThreeNodeJobAveragesExactly(config, "mn"));
  // A second job on the same daemons forms again through etcd.
  std::vector<Proc> ps =
      StartJob("again", {{"node-a", 1}, {"node-b", 1}, {"node-c", 1}},
               {"--iterations", "20", "--seed", "5"});
  std::vector<Exit> exits = WaitAll(ps, milliseconds(60000));
  for (size_t i = 0; i < exits.size(); ++i) {
    ASSERT_EQ(exits[i].code, 0) << ps[i].name << ":\n" << exits[i].output;
    EXPECT_THAT(exits[i].output, HasSubstr("PASS iterations=20"));
    EXPECT_EQ(ReportedNumber(exits[i].output, "world"), 3);
    EXPECT_GT(ReportedNumber(exits[i].output, "verified"), 0);
  }
}

TEST_F(EtcdMultiNodeTest, ThreeDaemonsOnEtcdOverMutualTlsAverageExactly) {
  ASSERT_NO_FATAL_FAILURE(StartEtcd(EtcdAuth::kMutualTls));
  const std::string config = WriteConfig("mtls", EtcdTlsLines());
  ASSERT_NO_FATAL_FAILURE(ExpectThreeNodeJobAveragesExactly(config, "mn"));
  // The client key's text: in no answer and no log line.
  const std::string key = ReadFile(TestCerts() + "/node.key");
  const std::string key_line = key.substr(key.find('\n') + 1, 40);
  ASSERT_GE(key_line.size(), 40u) << key;
  for (const NodeDaemon& d : daemons_) {
    EXPECT_THAT(ReadFile(d.proc.log), HasSubstr("(mTLS, prefix /gradd-test/"))
        << d.node_id;
#ifdef GRADDCTL_BINARY
    Exit status = Ctl(d.node_id, {"status"});
    EXPECT_EQ(status.code, 0) << status.output;
    EXPECT_THAT(status.output,
                HasSubstr(absl::StrCat("rendezvous      etcd at ",
                                       cluster_->endpoints()[0],
                                       " (mTLS, prefix /gradd-test/)\n")))
        << d.node_id;
    EXPECT_THAT(status.output, ContainsRegex("etcd lease +[0-9a-f]+ held"))
        << d.node_id;
    for (const std::vector<std::string>& args :
         std::vector<std::vector<std::string>>{
             {"--json", "status"}, {"config"}, {"--json", "config"}}) {
      Exit e = Ctl(d.node_id, args);
      EXPECT_EQ(e.code, 0) << e.output;
      EXPECT_THAT(e.output, Not(HasSubstr(key_line))) << d.node_id;
      EXPECT_THAT(e.output, Not(HasSubstr("PRIVATE KEY"))) << d.node_id;
    }
#endif
    EXPECT_THAT(ReadFile(d.proc.log), Not(HasSubstr(key_line))) << d.node_id;
  }
}

// etcd demands client certificates: a daemon with none (only the CA), and
// one with a certificate of another CA, cannot start.
TEST_F(EtcdMultiNodeTest, ADaemonWithoutAcceptedEtcdCertificatesCannotStart) {
  ASSERT_NO_FATAL_FAILURE(StartEtcd(EtcdAuth::kMutualTls));
  const std::string no_cert =
      WriteConfig("no-cert", {"ca_file: " + TestCerts() + "/ca.crt"});
  ExpectDaemonRefusesToStart(no_cert, milliseconds(60000));
  const std::string stranger =
      WriteConfig("stranger", {"ca_file: " + TestCerts() + "/ca.crt",
                               "cert_file: " + TestCerts() + "/stranger.crt",
                               "key_file: " + TestCerts() + "/stranger.key"});
  ExpectDaemonRefusesToStart(stranger, milliseconds(60000));
  // A plaintext client of a TLS etcd.
  const std::string plaintext = WriteConfig("plaintext", {});
  ExpectDaemonRefusesToStart(plaintext, milliseconds(60000));
}

// etcd with authentication on: the right password works (a 2-node job),
// a wrong one is refused at once naming the user and the endpoints, and
// neither password appears in any log.
TEST_F(EtcdMultiNodeTest, AWrongEtcdPasswordIsRefusedWithoutShowingIt) {
  ASSERT_NO_FATAL_FAILURE(StartEtcd(EtcdAuth::kPlaintext));
  const std::string password = "pw-right-7f3a9c";
  ASSERT_TRUE(cluster_->EnableAuth("gradd", password));
  const std::string right_file = dir_ + "/etcd-password";
  const std::string wrong_file = dir_ + "/etcd-wrong-password";
  { std::ofstream(right_file) << password << "\n"; }
  { std::ofstream(wrong_file) << "pw-wrong-41b2e8\n"; }
  chmod(right_file.c_str(), 0600);
  chmod(wrong_file.c_str(), 0600);

  const std::string wrong =
      WriteConfig("wrong", {"user: gradd", "password_file: " + wrong_file});
  const std::string refused =
      ExpectDaemonRefusesToStart(wrong, milliseconds(60000));
  EXPECT_THAT(refused, HasSubstr("user 'gradd'"));
  EXPECT_THAT(refused, Not(HasSubstr("pw-wrong-41b2e8")));
  EXPECT_THAT(refused, Not(HasSubstr(password)));

  const std::string right =
      WriteConfig("right", {"user: gradd", "password_file: " + right_file});
  ASSERT_TRUE(StartNode("node-a", right));
  ASSERT_TRUE(StartNode("node-b", right));
  std::vector<Proc> ps = StartJob("auth", {{"node-a", 1}, {"node-b", 2}},
                                  {"--iterations", "20", "--seed", "3"});
  std::vector<Exit> exits = WaitAll(ps, milliseconds(60000));
  for (size_t i = 0; i < exits.size(); ++i) {
    ASSERT_EQ(exits[i].code, 0) << ps[i].name << ":\n" << exits[i].output;
    EXPECT_THAT(exits[i].output, HasSubstr("PASS iterations=20"));
    EXPECT_EQ(ReportedNumber(exits[i].output, "world"), 3);
    EXPECT_GT(ReportedNumber(exits[i].output, "verified"), 0);
  }
  for (const NodeDaemon& d : daemons_) {
    const std::string log = ReadFile(d.proc.log);
    EXPECT_THAT(log, HasSubstr("+ user gradd")) << d.node_id;
    EXPECT_THAT(log, Not(HasSubstr(password))) << d.node_id;
  }
}

// Issue 34, operations: what an operator sees of a daemon on etcd. Before
// and during a job, `graddctl status` names the backend (endpoints, how
// they are secured, the prefix) and this node's lease, held; `graddctl
// jobs` / `job` and /metrics show the job's epoch; /metrics has the backend,
// the lease and etcd's calls; the job's epoch series goes with the job.
// etcd's password is in none of it, nor in any log.
TEST_F(EtcdMultiNodeTest, StatusMetricsAndLogShowTheBackendLeaseAndEpoch) {
#ifndef GRADDCTL_BINARY
  FAIL() << "graddctl not built (tools/graddctl; tests/integration/"
            "CMakeLists.txt gives its path as GRADDCTL_BINARY)";
#else
  ASSERT_NO_FATAL_FAILURE(StartEtcd(EtcdAuth::kPlaintext));
  const std::string password = "pw-obs-5d1e7b90";
  ASSERT_TRUE(cluster_->EnableAuth("gradd", password));
  const std::string password_file = dir_ + "/etcd-password";
  { std::ofstream(password_file) << password << "\n"; }
  chmod(password_file.c_str(), 0600);
  const std::string config =
      WriteConfig("obs", {"user: gradd", "password_file: " + password_file},
                  {"metrics:", "  listen_address: \"127.0.0.1:0\""});
  ASSERT_TRUE(StartNode("node-a", config));
  ASSERT_TRUE(StartNode("node-b", config));
  const std::string endpoint = cluster_->endpoints()[0];
  std::vector<std::string> shown;  // everything graddctl and /metrics said

  // Before any job: the backend and the lease.
  Exit status = Ctl("node-a", {"status"});
  ASSERT_EQ(status.code, 0) << status.output;
  shown.push_back(status.output);
  EXPECT_THAT(status.output,
              HasSubstr(absl::StrCat("rendezvous      etcd at ", endpoint,
                                     " (plaintext + user gradd, prefix "
                                     "/gradd-test/)\n")));
  EXPECT_THAT(status.output,
              ContainsRegex("etcd lease +[0-9a-f]+ held, ttl [^,]+, last kept "
                            "alive [^;]+ ago; granted 1, lost 0\n"));
  Exit json = Ctl("node-a", {"--json", "status"});
  ASSERT_EQ(json.code, 0) << json.output;
  shown.push_back(json.output);
  EXPECT_THAT(json.output, HasSubstr("\"backend\":\"etcd\""));
  EXPECT_THAT(json.output, HasSubstr(absl::StrCat("\"etcd_endpoints\":[\"",
                                                  endpoint, "\"]")));
  const size_t at = json.output.find("\"lease\":{\"id\":\"");
  ASSERT_NE(at, std::string::npos) << json.output;
  int64_t lease_id = 0;
  ASSERT_TRUE(absl::SimpleAtoi(
      json.output.substr(at + 15, json.output.find('"', at + 15) - at - 15),
      &lease_id))
      << json.output;
  const std::string lease_hex = absl::StrCat(absl::Hex(lease_id));
  EXPECT_THAT(status.output, HasSubstr(absl::StrCat(lease_hex, " held")));
  EXPECT_THAT(json.output, HasSubstr("\"held\":true"));

  // A job running on both nodes.
  std::vector<Proc> ps =
      StartJob("obs", {{"node-a", 1}, {"node-b", 1}},
               {"--iterations", "150", "--seed", "7", "--sleep-ms", "100"});
  bool running = false;
  Exit jobs;
  for (const auto deadline = Clock::now() + milliseconds(60000);
       !running && Clock::now() < deadline;) {
    jobs = Ctl("node-a", {"jobs"});
    for (absl::string_view line : absl::StrSplit(jobs.output, '\n')) {
      if (absl::StartsWith(line, "obs ") &&
          absl::StrContains(line, " running ")) {
        running = true;
      }
    }
    if (!running) std::this_thread::sleep_for(milliseconds(200));
  }
  ASSERT_TRUE(running) << jobs.output;
  shown.push_back(jobs.output);
  // ID STATE RANKS NODES WORLD ITERATION BUCKETS BYTES EPOCH
  EXPECT_THAT(jobs.output, ContainsRegex("obs +running +1/1 +2 +2 +[0-9]+ "
                                         "+[0-9]+ +[0-9.]+ [KMG]?i?B +0\n"));
  Exit job = Ctl("node-b", {"--json", "job", "obs"});
  ASSERT_EQ(job.code, 0) << job.output;
  shown.push_back(job.output);
  EXPECT_THAT(job.output, HasSubstr("\"epoch\":\"0\""));
  for (const std::string& id : {"node-a", "node-b"}) {
    const std::string metrics = Scrape(MetricsPort(id));
    shown.push_back(metrics);
    EXPECT_THAT(metrics, HasSubstr("gradd_job_epoch{job_id=\"obs\"} 0")) << id;
    EXPECT_THAT(metrics,
                HasSubstr(absl::StrCat(
                    "gradd_rendezvous_backend_info{address=\"", endpoint,
                    "\",backend=\"etcd\",prefix=\"/gradd-test/\",security="
                    "\"plaintext + user gradd\"} 1")))
        << id;
    EXPECT_THAT(metrics, HasSubstr("gradd_etcd_lease_held 1")) << id;
    EXPECT_THAT(metrics, ContainsRegex("gradd_etcd_lease_info\\{lease_id=\""
                                       "[0-9a-f]+\"\\} 1"))
        << id;
    EXPECT_THAT(metrics, HasSubstr("gradd_etcd_lease_grants_total 1")) << id;
    EXPECT_THAT(metrics, HasSubstr("gradd_etcd_lease_losses_total 0")) << id;
    // Formation went through etcd: transactions and authentication.
    EXPECT_THAT(metrics,
                ContainsRegex("gradd_etcd_requests_total\\{code=\"OK\",method="
                              "\"Txn\"\\} [1-9]"))
        << id;
    EXPECT_THAT(metrics,
                ContainsRegex("gradd_etcd_requests_total\\{code=\"OK\",method="
                              "\"Authenticate\"\\} [1-9]"))
        << id;
    EXPECT_THAT(metrics, HasSubstr(absl::StrCat(
                             "gradd_etcd_endpoint_failures_total{endpoint=\"",
                             endpoint, "\"} 0")))
        << id;
  }
  EXPECT_THAT(shown[shown.size() - 2],
              HasSubstr(absl::StrCat("lease_id=\"", lease_hex, "\"")));

  std::vector<Exit> exits = WaitAll(ps, milliseconds(120000));
  for (size_t i = 0; i < exits.size(); ++i) {
    ASSERT_EQ(exits[i].code, 0) << ps[i].name << ":\n" << exits[i].output;
    EXPECT_THAT(exits[i].output, HasSubstr("PASS iterations=150"));
  }
  // The job's series went with it; the lease is still held.
  const std::string after = Scrape(MetricsPort("node-a"));
  shown.push_back(after);
  EXPECT_THAT(after, Not(HasSubstr("gradd_job_epoch{job_id=\"obs\"}")));
  EXPECT_THAT(after, HasSubstr("gradd_etcd_lease_held 1"));
  Exit config_out = Ctl("node-a", {"config"});
  EXPECT_EQ(config_out.code, 0) << config_out.output;
  shown.push_back(config_out.output);
  EXPECT_THAT(config_out.output, HasSubstr(password_file));

  for (const std::string& text : shown) {
    EXPECT_THAT(text, Not(HasSubstr(password)));
  }
  for (const NodeDaemon& d : daemons_) {
    const std::string log = ReadFile(d.proc.log);
    EXPECT_THAT(log,
                HasSubstr(absl::StrCat("rendezvous backend etcd at ", endpoint,
                                       " (plaintext + user gradd, prefix "
                                       "/gradd-test/, lease ")))
        << d.node_id;
    EXPECT_THAT(log, Not(HasSubstr(password))) << d.node_id;
  }
#endif
}

// The etcd named in the config is not there: the daemon gives up after
// the client's retry timeout, naming every endpoint.
TEST_F(EtcdMultiNodeTest, UnreachableEtcdIsAStartErrorNamingTheEndpoints) {
  const std::string path = dir_ + "/gone.yaml";
  const int port = FreePort();
  std::ofstream(path) << "rendezvous:\n"
                      << "  backend: etcd\n"
                      << "  etcd:\n"
                      << "    endpoints: 127.0.0.1:" << port << "\n";
  NodeDaemon d = SpawnNode("node-a", path);
  Exit e = Wait(d.proc, milliseconds(60000));
  ASSERT_TRUE(e.code.has_value()) << e.output;
  EXPECT_NE(*e.code, 0) << e.output;
  EXPECT_THAT(e.output, HasSubstr(absl::StrCat("etcd 127.0.0.1:", port)));
  std::cout << "refused as expected: "
            << e.output.substr(e.output.rfind('\n', e.output.size() - 2) + 1);
}

// The password comes from rendezvous.etcd.password_file, read at start: a
// file that is missing or empty stops the daemon naming the key and the
// path, before any connection to etcd.
TEST_F(EtcdMultiNodeTest, AMissingOrEmptyPasswordFileIsAStartError) {
  const std::string missing = dir_ + "/no-such-password";
  const std::string empty = dir_ + "/empty-password";
  { std::ofstream(empty) << ""; }
  for (const std::string& file : {missing, empty}) {
    const std::string path = dir_ + "/pw.yaml";
    std::ofstream(path) << "rendezvous:\n"
                        << "  backend: etcd\n"
                        << "  etcd:\n"
                        << "    endpoints: 127.0.0.1:" << FreePort() << "\n"
                        << "    user: gradd\n"
                        << "    password_file: " << file << "\n";
    NodeDaemon d =
        SpawnNode("node-a", path, "pw-" + file.substr(dir_.size() + 1));
    Exit e = Wait(d.proc, milliseconds(20000));
    ASSERT_TRUE(e.code.has_value()) << e.output;
    EXPECT_NE(*e.code, 0) << e.output;
    EXPECT_THAT(e.output, HasSubstr(absl::StrCat(
                              "rendezvous.etcd.password_file = '", file, "'")));
    EXPECT_THAT(e.output,
                HasSubstr(file == missing ? "cannot be read" : "is empty"));
    // Refused at once, not after the etcd client's retry timeout.
    EXPECT_LT(e.elapsed, milliseconds(10000));
  }
}

}  // namespace
}  // namespace gradd::testing
