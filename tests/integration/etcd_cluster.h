// Test-only: a real etcd (Debian's etcd-server, /usr/bin/etcd) on loopback,
// one or several members, with OS-chosen ports and data in a temporary
// directory, started by the test and SIGKILLed at the end, as the harness
// starts daemons. With `tls`, etcd serves TLS with the certificates of
// tests/tools/make_test_certs.sh (node.crt: SAN 127.0.0.1) and demands a
// client certificate of the test CA (--client-cert-auth).
#ifndef GRADD_TESTS_INTEGRATION_ETCD_CLUSTER_H_
#define GRADD_TESTS_INTEGRATION_ETCD_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/rendezvous/etcd/etcd_client.h"

namespace gradd::testing {

inline constexpr char kEtcdBinary[] = "/usr/bin/etcd";

// The etcd the tests start: $GRADD_TEST_ETCD_BINARY when set (e.g. to check
// that a helper whose etcd does not come up fails cleanly), else
// kEtcdBinary.
std::string EtcdBinary();

class EtcdCluster {
 public:
  struct Options {
    int members = 1;
    // Directory for data, logs and certificates (must exist).
    std::string dir;
    // Serve TLS and require client certificates; `certs_dir` holds the
    // files of make_test_certs.sh.
    bool tls = false;
    std::string certs_dir;
    // How long a member may take to answer after its start. Generous: on
    // a loaded 2-core machine etcd takes seconds to come up.
    absl::Duration startup_timeout = absl::Seconds(60);
  };

  // Starts every member and waits until each answers (startup_timeout);
  // otherwise null, with a non-fatal test failure naming the binary, the
  // member, how it ended and the tail of its log. Never crashes: callers
  // write ASSERT_NE(cluster, nullptr) in the test body, or a helper they
  // call under ASSERT_NO_FATAL_FAILURE.
  static std::unique_ptr<EtcdCluster> Start(const Options& options);
  ~EtcdCluster();

  // host:port of every member's client URL, in member order.
  std::vector<std::string> endpoints() const;
  // Client options reaching the cluster as a legitimate client (the test
  // CA's client certificate when tls).
  EtcdClient::Options ClientOptions() const;
  // SIGKILLs member `i` (its data stays); Restart starts it again.
  void Kill(int i);
  bool Restart(int i);
  // Turns etcd's authentication on, as `etcdctl user add; etcdctl auth
  // enable` do: users root and `user`, both with `password` and the root
  // role (etcd demands a root user). Plaintext clusters only. False with a
  // test failure otherwise.
  bool EnableAuth(const std::string& user, const std::string& password);
  // The tail of member `i`'s log (for failure messages).
  std::string LogTail(int i) const;
  std::string LogPath(int i) const;

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
  };
  explicit EtcdCluster(Options options) : options_(std::move(options)) {}
  bool Launch(int i, bool initial);
  bool WaitHealthy(int i);

  const Options options_;
  std::vector<Member> members_;
};

// Whether EtcdBinary() is there and executable (scripts/setup installs
// etcd-server).
bool HaveEtcd();

}  // namespace gradd::testing

#endif  // GRADD_TESTS_INTEGRATION_ETCD_CLUSTER_H_
