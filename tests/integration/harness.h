// Integration-test harness: a real gradd daemon on a socket in a fresh
// temporary directory, and real trainer processes (posix_spawn), each with
// its stdout/stderr in a log file. Every wait is bounded; whatever is still
// running at teardown is SIGKILLed, so a broken daemon fails tests instead
// of hanging ctest.
#ifndef GRADD_TESTS_INTEGRATION_HARNESS_H_
#define GRADD_TESTS_INTEGRATION_HARNESS_H_

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace gradd::testing {

using std::chrono::milliseconds;

// A spawned process and its log.
struct Proc {
  pid_t pid = -1;
  std::string log;
  std::string name;
};

struct Exit {
  // Exit code, or 128 + signal number; nullopt if it did not end in time.
  std::optional<int> code;
  std::string output;
  milliseconds elapsed{0};
};

std::string ReadFile(const std::string& path);

// The daemon and test trainer the fixture starts: the build's, unless
// $GRADD_TEST_DAEMON_BINARY / $GRADD_TEST_TRAINER_BINARY name others (a
// bundle moved to another machine: scripts/gpu-check).
std::string DaemonBinary();
std::string TrainerBinary();

// One daemon of a multi-node test (node_cluster.h).
struct NodeDaemon {
  std::string node_id;
  std::string socket;
  Proc proc;
};

// Base fixture: creates the temp dir, starts gradd, kills leftovers.
class GraddTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Starts gradd on socket_; returns false (with a test failure) if it is
  // not listening within 10 s.
  bool StartDaemon();
  // SIGTERM, then waits up to `timeout` for gradd's exit code.
  std::optional<int> StopDaemon(milliseconds timeout = milliseconds(10000));

  // Spawns argv[0] with argv, output to <dir>/<name>.log.
  Proc Spawn(const std::string& name, const std::vector<std::string>& argv);
  // The same with "NAME=value" entries added to (or replacing those of)
  // this process's environment.
  Proc Spawn(const std::string& name, const std::vector<std::string>& argv,
             const std::vector<std::string>& env);
  // Waits for `p` to end, at most `timeout` (then SIGKILLs it).
  Exit Wait(Proc& p, milliseconds timeout);
  // Stops every daemon still running with SIGTERM and expects it to exit
  // cleanly (code 0) within `timeout`; with `print_logs`, prints each
  // one's log to stderr afterwards (a failed test's evidence).
  void StopNodeDaemons(std::vector<NodeDaemon>& daemons, milliseconds timeout,
                       bool print_logs);
  // Waits for the first of `ps` to end (at most `timeout`); its index, or
  // -1. The others keep running.
  int WaitAny(std::vector<Proc>& ps, milliseconds timeout, Exit* exit);
  // Waits until `text` appears in p's log; false after `timeout`.
  bool WaitForText(const Proc& p, const std::string& text,
                   milliseconds timeout);

  // A test trainer for `job` with the common flags plus `extra`.
  Proc SpawnTrainer(const std::string& job, int rank, int world,
                    const std::vector<std::string>& extra = {});
  // The same for any trainer binary taking the common flags (--socket,
  // --job, --local-rank, --local-world-size), on `socket`; its log is
  // named `name`.
  Proc SpawnTrainerBinary(const std::string& binary, const std::string& socket,
                          const std::string& name, const std::string& job,
                          int rank, int world,
                          const std::vector<std::string>& extra);
  // Runs `world` trainers of `job` (extra_for_rank(r) flags each) and waits
  // for all of them.
  std::vector<Exit> RunJob(const std::string& job, int world,
                           const std::vector<std::string>& extra,
                           milliseconds timeout);
  // Waits for every process in `ps`, all within one overall `timeout`.
  std::vector<Exit> WaitAll(std::vector<Proc>& ps, milliseconds timeout);
  // A short healthy 2-rank job: the daemon still serves after bad input.
  void ExpectHealthyJob(const std::string& job);
  // The gradd flags giving a node daemon the cluster's credentials, made in
  // dir_ on first use. Which kind comes from $GRADD_TEST_NODE_AUTH: "token"
  // (the default), "mtls" (TestCerts()) or "insecure"
  // (--rendezvous-insecure); ctest runs the multi-node suite with token and
  // with mtls.
  std::vector<std::string> NodeAuthFlags();
  // The test certificates (made with openssl by
  // tests/tools/make_test_certs.sh, which lists them) in <dir_>/certs, made
  // on first use: the daemons' mutual TLS and a test etcd's share them.
  // "" with a test failure when they cannot be made.
  std::string TestCerts();
  // `n` more daemons on loopback for multi-node jobs: node-0 is the
  // rendezvous coordinator (OS-chosen port), the others point at it; each
  // gets NodeAuthFlags(), daemon_flags_ and `flags`. Their sockets in node
  // order, or empty (with a failure) if one is not up within 10 s. SIGKILLed at
  // TearDown.
  std::vector<std::string> StartNodeDaemons(
      int n, const std::vector<std::string>& flags = {});
  // One trainer per node socket (local rank 0 of 1, --num-nodes the number
  // of sockets) running `job` with `extra`; waits for all within `timeout`.
  std::vector<Exit> RunOneTrainerPerNode(
      const std::vector<std::string>& sockets, const std::string& job,
      const std::vector<std::string>& extra, milliseconds timeout);
  // Rank 1 of a 2-rank job stalls in iteration 3 and is SIGKILLed: rank 0
  // fails with an error naming local rank 1 and iteration 3, and the
  // daemon then runs a next 2-rank job. `flags` go to every trainer;
  // `timeout` bounds each wait.
  void ExpectKilledTrainerFailsItsJob(const std::vector<std::string>& flags,
                                      milliseconds timeout);

  std::string dir_;
  std::string socket_;
  // Extra gradd flags for StartDaemon (set before GraddTest::SetUp).
  std::vector<std::string> daemon_flags_;
  // NodeAuthFlags() and TestCerts() once made.
  std::vector<std::string> node_auth_flags_;
  std::string certs_;
  Proc daemon_;
  std::vector<Proc> procs_;
};

// A fresh directory "/tmp/<prefix>XXXXXX" (short: Unix socket paths are
// limited to 107 bytes); "" and a test failure when it cannot be made.
// The one helper of tests/support/temp_dir.h, by the harness's name.
inline std::string MakeTestDir(const std::string& prefix) {
  return MakeTempDir(prefix);
}

// Trainer reports: the text after " key=" in `output` up to the next space
// or end of line ("" if absent), and a comma-separated list of ints (a
// failed parse is a test failure).
std::string ReportedValue(const std::string& output, const std::string& key);
std::vector<int> ReportedInts(const std::string& csv);
// The number after the first "key=" in `output` (world=, verified=,
// buckets=, ...), or -1 when there is none.
long ReportedNumber(const std::string& output, const std::string& key);
// A reported plan ("0,2|1,3": buckets of parameter indices): inside every
// bucket the parameters follow `order` (a test failure naming the bucket
// and `whose` order otherwise). Returns the number of buckets.
int ExpectBucketsFollow(const std::string& plan, const std::vector<int>& order,
                        const std::string& whose);

// A loopback TCP port nobody listens on right now (bound, read, released;
// 0 if none could be bound).
int FreePort();

}  // namespace gradd::testing

#endif  // GRADD_TESTS_INTEGRATION_HARNESS_H_
