// rendezvous.backend: etcd end to end (issue 34): real gradd daemons whose
// rendezvous store is a real etcd (Debian's etcd-server, started on
// loopback by etcd_cluster.h) form multi-node jobs of real trainer
// processes, which check every averaged value exactly; the same with the
// daemons reaching etcd over mutual TLS; and daemons whose etcd
// credentials are missing or wrong refusing to start with an error that
// names the endpoints and no secret. No daemon is a coordinator here: no
// --rendezvous-listen, no --coordinator.
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/etcd_cluster.h"
#include "tests/integration/harness.h"

namespace gradd::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using Clock = std::chrono::steady_clock;

// Number after "key=" in a trainer's output, or -1.
long Field(const std::string& output, const std::string& key) {
  size_t at = output.find(key + "=");
  if (at == std::string::npos) return -1;
  return std::strtol(output.c_str() + at + key.size() + 1, nullptr, 10);
}

// How the daemons reach etcd.
enum class EtcdAuth { kPlaintext, kMutualTls };

class EtcdMultiNodeTest : public GraddTest {
 protected:
  void SetUp() override {
    dir_ = MakeTestDir("gradd-etcd-mn-");
    ASSERT_FALSE(dir_.empty());
  }

  void TearDown() override {
    // The daemons before etcd: a daemon that stops cleanly revokes its
    // lease, which needs etcd.
    StopNodeDaemons(daemons_, milliseconds(20000), HasFailure());
    if (HasFailure() && cluster_ != nullptr) {
      std::cerr << "---- etcd log ----\n" << cluster_->LogTail(0);
    }
    cluster_.reset();
    GraddTest::TearDown();
  }

  // Starts a one-member etcd; with kMutualTls it serves TLS and demands
  // client certificates of the test CA (the certificates the daemons get).
  // Fatal on failure: call under ASSERT_NO_FATAL_FAILURE.
  void StartEtcd(EtcdAuth auth) {
    EtcdCluster::Options o;
    o.dir = dir_;
    if (auth == EtcdAuth::kMutualTls) {
      o.tls = true;
      o.certs_dir = Certs();
      ASSERT_FALSE(o.certs_dir.empty());
    }
    cluster_ = EtcdCluster::Start(o);
    ASSERT_NE(cluster_, nullptr) << "etcd did not start (see above)";
  }

  // The test certificates (tests/tools/make_test_certs.sh), made once.
  std::string Certs() {
    if (!certs_.empty()) return certs_;
    const std::string certs = dir_ + "/certs";
    const std::string cmd = absl::StrCat("sh '", GRADD_SOURCE_DIR,
                                         "/tests/tools/make_test_certs.sh' '",
                                         certs, "' >", dir_, "/certs.log 2>&1");
    if (std::system(cmd.c_str()) != 0) {
      ADD_FAILURE() << "could not make test certificates: " << cmd;
      return "";
    }
    certs_ = certs;
    return certs_;
  }

  // The daemons' config: the etcd backend at the cluster's endpoints, with
  // `etcd_lines` (indented under rendezvous.etcd) for its credentials.
  std::string WriteConfig(const std::string& name,
                          const std::vector<std::string>& etcd_lines) {
    const std::string path = absl::StrCat(dir_, "/", name, ".yaml");
    std::ofstream out(path);
    out << "rendezvous:\n"
        << "  backend: etcd\n"
        << "  join_timeout_ms: 30000\n"
        << "  collective_timeout_ms: 20000\n"
        << "  expected_node_ids: node-a, node-b, node-c\n"
        << "  etcd:\n"
        << "    endpoints: " << absl::StrJoin(cluster_->endpoints(), ",")
        << "\n"
        << "    prefix: /gradd-test/\n";
    for (const std::string& line : etcd_lines) out << "    " << line << "\n";
    return path;
  }

  // The client certificate, key and CA of the test CA for etcd.
  std::vector<std::string> EtcdTlsLines() {
    return {"ca_file: " + Certs() + "/ca.crt",
            "cert_file: " + Certs() + "/node.crt",
            "key_file: " + Certs() + "/node.key"};
  }

  // Starts node `id`'s daemon with `config` and the Gloo pair credentials
  // (NodeAuthFlags). False (with a failure) if it is not serving within
  // 30 s (etcd's lease comes first).
  bool StartNode(const std::string& id, const std::string& config) {
    NodeDaemon d = SpawnNode(id, config);
    daemons_.push_back(d);
    const auto deadline = Clock::now() + milliseconds(30000);
    struct stat st;
    while (Clock::now() < deadline) {
      if (stat(d.socket.c_str(), &st) == 0 &&
          stat((d.socket + ".session").c_str(), &st) == 0) {
        return true;
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    ADD_FAILURE() << "gradd " << id << " did not come up:\n"
                  << ReadFile(d.proc.log);
    return false;
  }

  NodeDaemon SpawnNode(const std::string& id, const std::string& config,
                       const std::string& log_name = "") {
    NodeDaemon d;
    d.node_id = id;
    d.socket = absl::StrCat(dir_, "/", id, "/gradd.sock");
    std::vector<std::string> argv = {DaemonBinary(), "--socket", d.socket,
                                     "--node-id",    id,         "--config",
                                     config};
    const std::vector<std::string> auth = NodeAuthFlags();
    argv.insert(argv.end(), auth.begin(), auth.end());
    d.proc =
        Spawn(log_name.empty() ? absl::StrCat("gradd-", id) : log_name, argv);
    // Stopped by TearDown with SIGTERM, not by the trainers' SIGKILL sweep.
    procs_.pop_back();
    return d;
  }

  const NodeDaemon& Node(const std::string& id) {
    for (const NodeDaemon& d : daemons_) {
      if (d.node_id == id) return d;
    }
    ADD_FAILURE() << "no node " << id;
    return daemons_.front();
  }

  // Trainers of `job` on every (node id, local world size), in order.
  std::vector<Proc> StartJob(
      const std::string& job,
      const std::vector<std::pair<std::string, int>>& nodes,
      const std::vector<std::string>& extra) {
    std::vector<Proc> ps;
    for (const auto& [id, world] : nodes) {
      for (int r = 0; r < world; ++r) {
        std::vector<std::string> argv = {TrainerBinary(),
                                         "--socket",
                                         Node(id).socket,
                                         "--job",
                                         job,
                                         "--local-rank",
                                         absl::StrCat(r),
                                         "--local-world-size",
                                         absl::StrCat(world),
                                         "--num-nodes",
                                         absl::StrCat(nodes.size())};
        argv.insert(argv.end(), extra.begin(), extra.end());
        ps.push_back(Spawn(absl::StrCat(job, ".", id, ".rank", r), argv));
      }
    }
    return ps;
  }

  // Three daemons on `config` run a job of 6 ranks over uneven local
  // worlds (a: 2, b: 1, c: 3); every trainer checks every averaged value
  // against its closed form with world size 6.
  void ExpectThreeNodeJobAveragesExactly(const std::string& config,
                                         const std::string& job) {
    ASSERT_TRUE(StartNode("node-a", config));
    ASSERT_TRUE(StartNode("node-b", config));
    ASSERT_TRUE(StartNode("node-c", config));
    std::vector<Proc> ps = StartJob(
        job, {{"node-a", 2}, {"node-b", 1}, {"node-c", 3}},
        {"--iterations", "50", "--seed", "11", "--bucket-cap-mb", "0.01",
         "--first-bucket-cap-mb", "0.002", "--broadcast-bytes", "3000"});
    std::vector<Exit> exits = WaitAll(ps, milliseconds(90000));
    std::set<long> ranks;
    long buckets = -1;
    for (size_t i = 0; i < exits.size(); ++i) {
      const Exit& e = exits[i];
      ASSERT_EQ(e.code, 0) << ps[i].name << ":\n" << e.output;
      EXPECT_THAT(e.output, HasSubstr("BROADCAST_OK bytes=3000"));
      EXPECT_THAT(e.output, HasSubstr("PASS iterations=50"));
      EXPECT_EQ(Field(e.output, "world"), 6) << ps[i].name;
      EXPECT_GT(Field(e.output, "verified"), 0) << ps[i].name;
      ranks.insert(Field(e.output, "rank"));
      if (i == 0) buckets = Field(e.output, "buckets");
      EXPECT_EQ(Field(e.output, "buckets"), buckets) << "plans differ";
    }
    EXPECT_EQ(ranks, (std::set<long>{0, 1, 2, 3, 4, 5}));
    EXPECT_GE(buckets, 4);
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

  std::unique_ptr<EtcdCluster> cluster_;
  std::string certs_;
  std::vector<NodeDaemon> daemons_;
  int refused_ = 0;
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
    EXPECT_EQ(Field(exits[i].output, "world"), 3);
    EXPECT_GT(Field(exits[i].output, "verified"), 0);
  }
}

TEST_F(EtcdMultiNodeTest, ThreeDaemonsOnEtcdOverMutualTlsAverageExactly) {
  ASSERT_NO_FATAL_FAILURE(StartEtcd(EtcdAuth::kMutualTls));
  const std::string config = WriteConfig("mtls", EtcdTlsLines());
  ASSERT_NO_FATAL_FAILURE(ExpectThreeNodeJobAveragesExactly(config, "mn"));
  for (const NodeDaemon& d : daemons_) {
    EXPECT_THAT(ReadFile(d.proc.log), HasSubstr("(mTLS, prefix /gradd-test/"))
        << d.node_id;
  }
}

// etcd demands client certificates: a daemon with none (only the CA), and
// one with a certificate of another CA, cannot start.
TEST_F(EtcdMultiNodeTest, ADaemonWithoutAcceptedEtcdCertificatesCannotStart) {
  ASSERT_NO_FATAL_FAILURE(StartEtcd(EtcdAuth::kMutualTls));
  const std::string no_cert =
      WriteConfig("no-cert", {"ca_file: " + Certs() + "/ca.crt"});
  ExpectDaemonRefusesToStart(no_cert, milliseconds(60000));
  const std::string stranger =
      WriteConfig("stranger", {"ca_file: " + Certs() + "/ca.crt",
                               "cert_file: " + Certs() + "/stranger.crt",
                               "key_file: " + Certs() + "/stranger.key"});
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
    EXPECT_EQ(Field(exits[i].output, "world"), 3);
    EXPECT_GT(Field(exits[i].output, "verified"), 0);
  }
  for (const NodeDaemon& d : daemons_) {
    const std::string log = ReadFile(d.proc.log);
    EXPECT_THAT(log, HasSubstr("+ user gradd")) << d.node_id;
    EXPECT_THAT(log, Not(HasSubstr(password))) << d.node_id;
  }
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
