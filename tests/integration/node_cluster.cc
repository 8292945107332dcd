#include "tests/integration/node_cluster.h"

#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"

namespace gradd::testing {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

bool Serving(const std::string& socket) {
  struct stat st;
  return stat(socket.c_str(), &st) == 0 &&
         stat((socket + ".session").c_str(), &st) == 0;
}

}  // namespace

std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::kEtcd ? "etcd" : "builtin";
}

void PrintTo(Backend backend, std::ostream* os) {
  *os << (backend == Backend::kEtcd ? "etcd" : "builtin");
}

NodeClusterTest::NodeClusterTest(Backend backend, std::string dir_prefix,
                                 std::optional<EtcdAuth> etcd_at_setup)
    : backend_(backend),
      dir_prefix_(std::move(dir_prefix)),
      etcd_at_setup_(etcd_at_setup) {}

void NodeClusterTest::SetUp() {
  dir_ = MakeTestDir(dir_prefix_);
  ASSERT_FALSE(dir_.empty());
  if (backend_ == Backend::kEtcd && etcd_at_setup_.has_value()) {
    ASSERT_NO_FATAL_FAILURE(StartEtcd(*etcd_at_setup_));
  }
}

void NodeClusterTest::TearDown() {
  // The daemons before etcd: a daemon that stops cleanly revokes its lease,
  // which needs etcd.
  StopNodeDaemons(daemons_,
                  milliseconds(backend_ == Backend::kEtcd ? 20000 : 10000),
                  HasFailure());
  if (HasFailure() && cluster_ != nullptr) {
    std::cerr << "---- etcd log ----\n" << cluster_->LogTail(0);
  }
  cluster_.reset();
  GraddTest::TearDown();
}

void NodeClusterTest::StartEtcd(EtcdAuth auth) {
  EtcdCluster::Options o;
  o.dir = dir_;
  if (auth == EtcdAuth::kMutualTls) {
    o.tls = true;
    o.certs_dir = TestCerts();
    ASSERT_FALSE(o.certs_dir.empty());
  }
  const auto start = Clock::now();
  cluster_ = EtcdCluster::Start(o);
  ASSERT_NE(cluster_, nullptr) << "etcd did not start (see above)";
  etcd_tls_ = o.tls;
  RecordProperty("etcd_start_ms",
                 static_cast<int>(std::chrono::duration_cast<milliseconds>(
                                      Clock::now() - start)
                                      .count()));
}

std::vector<std::string> NodeClusterTest::EtcdTlsLines() {
  const std::string certs = TestCerts();
  return {"ca_file: " + certs + "/ca.crt", "cert_file: " + certs + "/node.crt",
          "key_file: " + certs + "/node.key"};
}

std::string NodeClusterTest::WriteNodeConfig(const NodeConfig& config) {
  const std::string path = absl::StrCat(dir_, "/", config.name, ".yaml");
  std::ofstream out(path);
  out << "rendezvous:\n";
  if (backend_ == Backend::kEtcd) out << "  backend: etcd\n";
  out << "  formation_timeout_ms: " << config.formation_timeout_ms << "\n"
      << "  collective_timeout_ms: " << config.collective_timeout_ms << "\n";
  if (!config.expected_node_ids.empty()) {
    out << "  expected_node_ids: " << config.expected_node_ids << "\n";
  }
  if (backend_ == Backend::kEtcd) {
    if (cluster_ == nullptr) {
      ADD_FAILURE() << "WriteNodeConfig on etcd before StartEtcd";
      return path;
    }
    out << "  etcd:\n"
        << "    endpoints: " << absl::StrJoin(cluster_->endpoints(), ",")
        << "\n"
        << "    prefix: /gradd-test/\n";
    const std::vector<std::string> credentials =
        config.etcd_lines.has_value()
            ? *config.etcd_lines
            : (etcd_tls_ ? EtcdTlsLines() : std::vector<std::string>());
    for (const std::string& line : credentials) out << "    " << line << "\n";
  }
  for (const std::string& line : config.top_lines) out << line << "\n";
  return path;
}

NodeDaemon NodeClusterTest::SpawnNode(
    const std::string& id, const std::string& config,
    const std::string& log_name, const std::vector<std::string>& extra_flags) {
  NodeDaemon d;
  d.node_id = id;
  d.socket = absl::StrCat(dir_, "/", id, "/gradd.sock");
  std::vector<std::string> argv = {DaemonBinary(),
                                   "--socket",
                                   d.socket,
                                   "--node-id",
                                   id,
                                   "--config",
                                   config,
                                   "--metrics-port-file",
                                   MetricsPortFile(id)};
  const std::vector<std::string> auth = NodeAuthFlags();
  argv.insert(argv.end(), auth.begin(), auth.end());
  if (backend_ == Backend::kBuiltin) {
    if (daemons_.empty()) {
      argv.insert(argv.end(),
                  {"--rendezvous-listen", "127.0.0.1:0",
                   "--rendezvous-port-file", dir_ + "/coordinator.port"});
    } else {
      argv.insert(argv.end(), {"--coordinator", coordinator_});
    }
  }
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  d.proc =
      Spawn(log_name.empty() ? absl::StrCat("gradd-", id) : log_name, argv);
  // Stopped by TearDown with SIGTERM, not by the trainers' SIGKILL sweep.
  if (d.proc.pid > 0) procs_.pop_back();
  return d;
}

bool NodeClusterTest::StartNode(const std::string& id,
                                const std::string& config) {
  const bool coordinator = backend_ == Backend::kBuiltin && daemons_.empty();
  NodeDaemon d = SpawnNode(id, config);
  daemons_.push_back(d);
  const auto deadline =
      Clock::now() + milliseconds(backend_ == Backend::kEtcd ? 30000 : 10000);
  while (Clock::now() < deadline) {
    bool up = Serving(d.socket);
    if (up && coordinator) {
      int port = 0;
      const std::string text(
          absl::StripAsciiWhitespace(ReadFile(dir_ + "/coordinator.port")));
      up = absl::SimpleAtoi(text, &port) && port > 0;
      if (up) coordinator_ = absl::StrCat("127.0.0.1:", port);
    }
    if (up) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  ADD_FAILURE() << "gradd " << id << " did not come up:\n"
                << ReadFile(d.proc.log);
  return false;
}

bool NodeClusterTest::StartNodes(const std::vector<std::string>& ids,
                                 const std::string& config) {
  for (const std::string& id : ids) {
    if (!StartNode(id, config)) return false;
  }
  return true;
}

NodeDaemon& NodeClusterTest::Node(const std::string& id) {
  for (NodeDaemon& d : daemons_) {
    if (d.node_id == id) return d;
  }
  ADD_FAILURE() << "no node " << id;
  return daemons_.front();
}

std::vector<std::string> NodeClusterTest::NodeSockets() const {
  std::vector<std::string> sockets;
  for (const NodeDaemon& d : daemons_) sockets.push_back(d.socket);
  return sockets;
}

Proc NodeClusterTest::Trainer(const std::string& id, const std::string& job,
                              int rank, int world, int num_nodes,
                              const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {TrainerBinary(),
                                   "--socket",
                                   Node(id).socket,
                                   "--job",
                                   job,
                                   "--local-rank",
                                   absl::StrCat(rank),
                                   "--local-world-size",
                                   absl::StrCat(world),
                                   "--num-nodes",
                                   absl::StrCat(num_nodes)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Spawn(absl::StrCat(job, ".", id, ".rank", rank), argv);
}

std::vector<Proc> NodeClusterTest::StartJob(
    const std::string& job,
    const std::vector<std::pair<std::string, int>>& nodes,
    const std::vector<std::string>& extra,
    const std::vector<std::string>& extra_last_node) {
  std::vector<Proc> ps;
  for (size_t k = 0; k < nodes.size(); ++k) {
    std::vector<std::string> flags = extra;
    if (k + 1 == nodes.size()) {
      flags.insert(flags.end(), extra_last_node.begin(), extra_last_node.end());
    }
    for (int r = 0; r < nodes[k].second; ++r) {
      ps.push_back(Trainer(nodes[k].first, job, r, nodes[k].second,
                           static_cast<int>(nodes.size()), flags));
    }
  }
  return ps;
}

void NodeClusterTest::ExpectUnevenThreeNodeJobAveragesExactly(
    const std::string& job, int iterations, int seed, long min_buckets,
    milliseconds timeout) {
  // Node ranks follow the sorted node ids: a = 0 (ranks 0-1), b = 1 (rank
  // 2), c = 2 (ranks 3-5). The broadcasts come from global ranks 0 and 5,
  // i.e. from node a and from the last local rank of node c.
  std::vector<Proc> ps =
      StartJob(job, {{"node-a", 2}, {"node-b", 1}, {"node-c", 3}},
               {"--iterations", absl::StrCat(iterations), "--seed",
                absl::StrCat(seed), "--bucket-cap-mb", "0.01",
                "--first-bucket-cap-mb", "0.002", "--broadcast-bytes", "3000"});
  std::vector<Exit> exits = WaitAll(ps, timeout);
  std::set<long> ranks;
  long buckets = -1;
  for (size_t i = 0; i < exits.size(); ++i) {
    const Exit& e = exits[i];
    ASSERT_EQ(e.code, 0) << ps[i].name << ":\n" << e.output;
    EXPECT_THAT(e.output, HasSubstr("BROADCAST_OK bytes=3000")) << ps[i].name;
    EXPECT_THAT(e.output,
                HasSubstr(absl::StrCat("PASS iterations=", iterations)))
        << ps[i].name;
    EXPECT_EQ(ReportedNumber(e.output, "world"), 6) << ps[i].name;
    EXPECT_GT(ReportedNumber(e.output, "verified"), 0) << ps[i].name;
    ranks.insert(ReportedNumber(e.output, "rank"));
    if (i == 0) buckets = ReportedNumber(e.output, "buckets");
    EXPECT_EQ(ReportedNumber(e.output, "buckets"), buckets) << "plans differ";
  }
  EXPECT_EQ(ranks, (std::set<long>{0, 1, 2, 3, 4, 5}));
  EXPECT_GE(buckets, min_buckets);
}

std::string NodeClusterTest::MetricsPortFile(const std::string& id) const {
  return absl::StrCat(dir_, "/", id, ".metrics-port");
}

int NodeClusterTest::MetricsPort(const std::string& id) {
  int port = 0;
  const std::string text = ReadFile(MetricsPortFile(id));
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port)) {
    ADD_FAILURE() << id << " wrote no metrics port: '" << text << "'";
  }
  return port;
}

}  // namespace gradd::testing
