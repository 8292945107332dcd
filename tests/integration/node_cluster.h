// Test fixture: several real gradd daemons on loopback forming multi-node
// jobs of real trainer processes, on either rendezvous backend (issue 34):
//
//   builtin  the first daemon started serves the store as the coordinator
//            (--rendezvous-listen on an OS-chosen port), the others point at
//            it (--coordinator);
//   etcd     a real one-member etcd (etcd_cluster.h) started for the test,
//            serving mutual TLS with the test CA's certificates, holds the
//            store; every daemon is configured for it and none is special.
//
// A suite that must hold on both derives from NodeClusterTest and
// ::testing::WithParamInterface<Backend>, and runs every case twice:
//
//   INSTANTIATE_TEST_SUITE_P(Backends, MultiNodeTest, BothBackends(),
//                            BackendName);   // .../builtin, .../etcd
//
// Each daemon gets the cluster's credentials for the Gloo pairs
// (NodeAuthFlags: a token, or mutual TLS under GRADD_TEST_NODE_AUTH=mtls) on
// both backends. Daemons are stopped at TearDown with SIGTERM and must exit
// 0, before etcd goes (a daemon that stops cleanly revokes its lease there);
// on a failure their logs and etcd's are printed.
#ifndef GRADD_TESTS_INTEGRATION_NODE_CLUSTER_H_
#define GRADD_TESTS_INTEGRATION_NODE_CLUSTER_H_

#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/etcd_cluster.h"
#include "tests/integration/harness.h"

namespace gradd::testing {

enum class Backend { kBuiltin, kEtcd };

// "builtin" / "etcd": the suffix of a parameterised test's name, and how
// gtest prints the parameter.
std::string BackendName(const ::testing::TestParamInfo<Backend>& info);
void PrintTo(Backend backend, std::ostream* os);
inline auto BothBackends() {
  return ::testing::Values(Backend::kBuiltin, Backend::kEtcd);
}

// How the daemons reach etcd.
enum class EtcdAuth { kPlaintext, kMutualTls };

class NodeClusterTest : public GraddTest {
 protected:
  // `dir_prefix` names the test directory (/tmp/<dir_prefix>XXXXXX). On
  // kEtcd, SetUp starts a one-member etcd with `etcd_at_setup`; nullopt
  // leaves that to the test (StartEtcd).
  NodeClusterTest(Backend backend, std::string dir_prefix,
                  std::optional<EtcdAuth> etcd_at_setup = EtcdAuth::kMutualTls);

  void SetUp() override;
  void TearDown() override;

  // Starts a one-member etcd; with kMutualTls it serves TLS and demands
  // client certificates of the test CA (the certificates the daemons get).
  // Fatal on failure: call under ASSERT_NO_FATAL_FAILURE.
  void StartEtcd(EtcdAuth auth);

  // The daemons' shared config file.
  struct NodeConfig {
    // Written to <dir_>/<name>.yaml.
    std::string name = "gradd";
    int formation_timeout_ms = 30000;
    int collective_timeout_ms = 20000;
    // rendezvous.expected_node_ids; "" leaves it out.
    std::string expected_node_ids = "node-a, node-b, node-c";
    // etcd only, lines under rendezvous.etcd (its credentials); nullopt:
    // EtcdTlsLines() when etcd serves TLS, none otherwise.
    std::optional<std::vector<std::string>> etcd_lines;
    // Lines at the top level (metrics:, ...).
    std::vector<std::string> top_lines;
  };
  // On etcd the config says rendezvous.backend: etcd, the cluster's
  // endpoints and the prefix /gradd-test/; on builtin it names no
  // coordinator (StartNode's flags do). Its path.
  std::string WriteNodeConfig(const NodeConfig& config);
  // The client certificate, key and CA of the test CA for etcd.
  std::vector<std::string> EtcdTlsLines();

  // Spawns node `id`'s daemon with `config`, NodeAuthFlags() and
  // `extra_flags` (on builtin: the first daemon of the test is the
  // coordinator, the later ones point at it), its log "<log_name>.log"
  // (default gradd-<id>). Not waited for, not in daemons_: see StartNode.
  NodeDaemon SpawnNode(const std::string& id, const std::string& config,
                       const std::string& log_name = "",
                       const std::vector<std::string>& extra_flags = {});
  // SpawnNode, then waits until the daemon serves (10 s; 30 s on etcd,
  // whose lease comes first) and, for the coordinator, has written its
  // port. False with a failure otherwise. Stopped at TearDown.
  bool StartNode(const std::string& id, const std::string& config);
  // StartNode for each id in turn; false at the first that fails.
  bool StartNodes(const std::vector<std::string>& ids,
                  const std::string& config);
  NodeDaemon& Node(const std::string& id);
  // The started daemons' sockets, in start order.
  std::vector<std::string> NodeSockets() const;

  // A trainer of `job` on node `id`, its log <job>.<id>.rank<rank>.
  Proc Trainer(const std::string& id, const std::string& job, int rank,
               int world, int num_nodes, const std::vector<std::string>& extra);
  // Trainers for `job` on every (node id, local world size), in order;
  // the last node's also get `extra_last_node`.
  std::vector<Proc> StartJob(
      const std::string& job,
      const std::vector<std::pair<std::string, int>>& nodes,
      const std::vector<std::string>& extra,
      const std::vector<std::string>& extra_last_node = {});
  // Runs `job` over uneven local worlds on the daemons node-a (2 ranks),
  // node-b (1) and node-c (3), which must be up: small buckets and a
  // 3000-byte broadcast, `iterations` iterations from `seed`. Every trainer
  // exits 0 within `timeout` having checked every averaged value against
  // its closed form with world size 6; together they are ranks 0-5 and
  // agree on a plan of at least `min_buckets` buckets. Fatal on a rank that
  // failed.
  void ExpectUnevenThreeNodeJobAveragesExactly(const std::string& job,
                                               int iterations, int seed,
                                               long min_buckets,
                                               milliseconds timeout);

  // Where node `id`'s daemon writes its /metrics port (when its config
  // has metrics.listen_address), and that port (0 with a failure if none).
  std::string MetricsPortFile(const std::string& id) const;
  int MetricsPort(const std::string& id);

  const Backend backend_;
  const std::string dir_prefix_;
  const std::optional<EtcdAuth> etcd_at_setup_;
  std::unique_ptr<EtcdCluster> cluster_;
  bool etcd_tls_ = false;
  std::vector<NodeDaemon> daemons_;
  // host:port of the built-in coordinator, once its daemon is up.
  std::string coordinator_;
};

}  // namespace gradd::testing

#endif  // GRADD_TESTS_INTEGRATION_NODE_CLUSTER_H_
