#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace gradd::testing {
namespace {

using Clock = std::chrono::steady_clock;

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  return remove(path);
}

std::optional<int> DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return std::nullopt;
}

}  // namespace

namespace {
std::string FromEnv(const char* name, const char* built) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : built;
}
}  // namespace

std::string DaemonBinary() {
  return FromEnv("GRADD_TEST_DAEMON_BINARY", GRADD_DAEMON_BINARY);
}
std::string TrainerBinary() {
  return FromEnv("GRADD_TEST_TRAINER_BINARY", GRADD_TEST_TRAINER);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void GraddTest::StopNodeDaemons(std::vector<NodeDaemon>& daemons,
                                milliseconds timeout, bool print_logs) {
  for (NodeDaemon& d : daemons) {
    if (d.proc.pid <= 0) continue;
    kill(d.proc.pid, SIGTERM);
    Exit e = Wait(d.proc, timeout);
    EXPECT_EQ(e.code, 0) << d.node_id << " did not exit cleanly:\n" << e.output;
  }
  if (!print_logs) return;
  for (const NodeDaemon& d : daemons) {
    std::cerr << "---- " << d.node_id << " log ----\n" << ReadFile(d.proc.log);
  }
}

void GraddTest::SetUp() {
  dir_ = MakeTestDir("gradd-it-");
  ASSERT_FALSE(dir_.empty());
  socket_ = dir_ + "/run/gradd.sock";
  ASSERT_TRUE(StartDaemon());
}

void GraddTest::TearDown() {
  for (Proc& p : procs_) {
    if (p.pid > 0) {
      kill(p.pid, SIGKILL);
      waitpid(p.pid, nullptr, 0);
      p.pid = -1;
    }
  }
  if (daemon_.pid > 0) {
    std::optional<int> code = StopDaemon();
    EXPECT_EQ(code, 0) << "gradd did not exit cleanly; its log:\n"
                       << ReadFile(daemon_.log);
    daemon_.pid = -1;
  }
  if (HasFailure() && !daemon_.log.empty()) {
    std::cerr << "---- gradd log ----\n" << ReadFile(daemon_.log);
  }
  if (!dir_.empty() && !HasFailure()) {
    nftw(dir_.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
  }
}

bool GraddTest::StartDaemon() {
  std::vector<std::string> argv = {DaemonBinary(), "--socket", socket_};
  argv.insert(argv.end(), daemon_flags_.begin(), daemon_flags_.end());
  daemon_ = Spawn("gradd", argv);
  // The daemon is stopped by StopDaemon (SIGTERM first), not by the SIGKILL
  // sweep over trainers in TearDown.
  if (daemon_.pid > 0) procs_.pop_back();
  const auto deadline = Clock::now() + milliseconds(10000);
  while (Clock::now() < deadline) {
    if (Exists(socket_) && Exists(socket_ + ".session")) return true;
    int status;
    if (waitpid(daemon_.pid, &status, WNOHANG) == daemon_.pid) {
      ADD_FAILURE() << "gradd exited at start-up:\n" << ReadFile(daemon_.log);
      daemon_.pid = -1;
      return false;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  ADD_FAILURE() << "gradd did not create " << socket_ << " within 10 s:\n"
                << ReadFile(daemon_.log);
  return false;
}

std::optional<int> GraddTest::StopDaemon(milliseconds timeout) {
  if (daemon_.pid <= 0) return std::nullopt;
  kill(daemon_.pid, SIGTERM);
  Exit e = Wait(daemon_, timeout);
  return e.code;
}

Proc GraddTest::Spawn(const std::string& name,
                      const std::vector<std::string>& argv) {
  return Spawn(name, argv, {});
}

Proc GraddTest::Spawn(const std::string& name,
                      const std::vector<std::string>& argv,
                      const std::vector<std::string>& env) {
  std::vector<std::string> vars = env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string key = entry.substr(0, entry.find('=') + 1);
    bool replaced = false;
    for (const std::string& v : env) replaced |= v.rfind(key, 0) == 0;
    if (!replaced) vars.push_back(entry);
  }
  std::vector<char*> envp;
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  Proc p;
  p.name = name;
  p.log = absl::StrCat(dir_, "/", name, ".log");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, p.log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int rc =
      posix_spawn(&p.pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    ADD_FAILURE() << "posix_spawn " << argv[0] << ": " << std::strerror(rc);
    p.pid = -1;
  } else {
    procs_.push_back(p);
  }
  return p;
}

Exit GraddTest::Wait(Proc& p, milliseconds timeout) {
  Exit e;
  const auto start = Clock::now();
  if (p.pid > 0) {
    const auto deadline = start + timeout;
    while (true) {
      int status;
      pid_t r = waitpid(p.pid, &status, WNOHANG);
      if (r == p.pid) {
        e.code = DecodeStatus(status);
        break;
      }
      if (r < 0 || Clock::now() >= deadline) {
        kill(p.pid, SIGKILL);
        waitpid(p.pid, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(milliseconds(2));
    }
    for (Proc& q : procs_) {
      if (q.pid == p.pid) q.pid = -1;
    }
    p.pid = -1;
  }
  e.elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  e.output = ReadFile(p.log);
  return e;
}

int GraddTest::WaitAny(std::vector<Proc>& ps, milliseconds timeout,
                       Exit* exit) {
  const auto start = Clock::now();
  while (Clock::now() - start < timeout) {
    for (size_t i = 0; i < ps.size(); ++i) {
      if (ps[i].pid <= 0) continue;
      int status;
      if (waitpid(ps[i].pid, &status, WNOHANG) == ps[i].pid) {
        exit->code = DecodeStatus(status);
        exit->elapsed =
            std::chrono::duration_cast<milliseconds>(Clock::now() - start);
        exit->output = ReadFile(ps[i].log);
        for (Proc& q : procs_) {
          if (q.pid == ps[i].pid) q.pid = -1;
        }
        ps[i].pid = -1;
        return static_cast<int>(i);
      }
    }
    std::this_thread::sleep_for(milliseconds(2));
  }
  return -1;
}

bool GraddTest::WaitForText(const Proc& p, const std::string& text,
                            milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (ReadFile(p.log).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return false;
}

Proc GraddTest::SpawnTrainer(const std::string& job, int rank, int world,
                             const std::vector<std::string>& extra) {
  return SpawnTrainerBinary(TrainerBinary(), socket_,
                            absl::StrCat(job, ".rank", rank), job, rank, world,
                            extra);
}

Proc GraddTest::SpawnTrainerBinary(const std::string& binary,
                                   const std::string& socket,
                                   const std::string& name,
                                   const std::string& job, int rank, int world,
                                   const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {binary,
                                   "--socket",
                                   socket,
                                   "--job",
                                   job,
                                   "--local-rank",
                                   absl::StrCat(rank),
                                   "--local-world-size",
                                   absl::StrCat(world)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Spawn(name, argv);
}

std::vector<Exit> GraddTest::RunJob(const std::string& job, int world,
                                    const std::vector<std::string>& extra,
                                    milliseconds timeout) {
  std::vector<Proc> ps;
  for (int r = 0; r < world; ++r)
    ps.push_back(SpawnTrainer(job, r, world, extra));
  return WaitAll(ps, timeout);
}

std::vector<Exit> GraddTest::WaitAll(std::vector<Proc>& ps,
                                     milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<Exit> exits;
  for (Proc& p : ps) {
    auto left =
        std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    exits.push_back(Wait(p, std::max(left, milliseconds(1))));
  }
  return exits;
}

void GraddTest::ExpectHealthyJob(const std::string& job) {
  std::vector<Exit> exits =
      RunJob(job, 2, {"--iterations", "5", "--seed", "7"}, milliseconds(20000));
  for (size_t r = 0; r < exits.size(); ++r) {
    EXPECT_EQ(exits[r].code, 0)
        << "healthy job " << job << " rank " << r << " after bad input:\n"
        << exits[r].output;
    EXPECT_NE(exits[r].output.find("PASS"), std::string::npos);
  }
}

std::vector<std::string> GraddTest::NodeAuthFlags() {
  if (!node_auth_flags_.empty()) return node_auth_flags_;
  const std::string kind = FromEnv("GRADD_TEST_NODE_AUTH", "token");
  if (kind == "insecure") {
    node_auth_flags_ = {"--rendezvous-insecure"};
  } else if (kind == "mtls") {
    const std::string certs = TestCerts();
    if (certs.empty()) return {};
    node_auth_flags_ = {"--rendezvous-tls-cert", certs + "/node.crt",
                        "--rendezvous-tls-key",  certs + "/node.key",
                        "--rendezvous-tls-ca",   certs + "/ca.crt"};
  } else if (kind == "token") {
    // A fresh random token per test directory, readable by us only.
    std::ifstream random("/dev/urandom", std::ios::binary);
    unsigned char bytes[24];
    random.read(reinterpret_cast<char*>(bytes), sizeof(bytes));
    std::string token;
    for (unsigned char b : bytes)
      absl::StrAppend(&token, absl::Hex(b, absl::kZeroPad2));
    const std::string path = dir_ + "/node-token";
    { std::ofstream(path) << token << "\n"; }
    chmod(path.c_str(), 0600);
    node_auth_flags_ = {"--rendezvous-token-file", path};
  } else {
    ADD_FAILURE() << "GRADD_TEST_NODE_AUTH='" << kind
                  << "': expected token, mtls or insecure";
  }
  return node_auth_flags_;
}

std::string GraddTest::TestCerts() {
  if (!certs_.empty()) return certs_;
  // From the source tree (not __FILE__, which a compiler cache may make
  // relative to the build directory).
  const std::string certs = dir_ + "/certs";
  const std::string cmd = absl::StrCat("sh '", GRADD_SOURCE_DIR,
                                       "/tests/tools/make_test_certs.sh' '",
                                       certs, "' >", dir_, "/certs.log 2>&1");
  if (std::system(cmd.c_str()) != 0) {
    ADD_FAILURE() << "could not make test certificates (is openssl "
                     "installed?): "
                  << cmd << "\n"
                  << ReadFile(dir_ + "/certs.log");
    return "";
  }
  certs_ = certs;
  return certs_;
}

std::vector<std::string> GraddTest::StartNodeDaemons(
    int n, const std::vector<std::string>& flags) {
  std::vector<std::string> sockets;
  std::string coordinator;
  const std::string port_file = dir_ + "/nodes.port";
  for (int k = 0; k < n; ++k) {
    const std::string id = absl::StrCat("node-", k);
    const std::string socket = absl::StrCat(dir_, "/", id, "/gradd.sock");
    std::vector<std::string> argv = {DaemonBinary(), "--socket", socket,
                                     "--node-id", id};
    const std::vector<std::string> auth = NodeAuthFlags();
    argv.insert(argv.end(), auth.begin(), auth.end());
    argv.insert(argv.end(), daemon_flags_.begin(), daemon_flags_.end());
    argv.insert(argv.end(), flags.begin(), flags.end());
    if (k == 0) {
      argv.insert(argv.end(), {"--rendezvous-listen", "127.0.0.1:0",
                               "--rendezvous-port-file", port_file});
    } else {
      argv.insert(argv.end(), {"--coordinator", coordinator});
    }
    Proc p = Spawn(absl::StrCat("gradd-", id), argv);
    const auto deadline = Clock::now() + milliseconds(10000);
    bool up = false;
    while (!up && Clock::now() < deadline) {
      up = Exists(socket) && Exists(socket + ".session");
      if (up && k == 0) {
        const std::string text = ReadFile(port_file);
        const long port = std::strtol(text.c_str(), nullptr, 10);
        up = port > 0;
        if (up) coordinator = absl::StrCat("127.0.0.1:", port);
      }
      if (!up) std::this_thread::sleep_for(milliseconds(10));
    }
    if (!up) {
      ADD_FAILURE() << id << " did not come up within 10 s:\n"
                    << ReadFile(p.log);
      return {};
    }
    sockets.push_back(socket);
  }
  return sockets;
}

std::vector<Exit> GraddTest::RunOneTrainerPerNode(
    const std::vector<std::string>& sockets, const std::string& job,
    const std::vector<std::string>& extra, milliseconds timeout) {
  std::vector<Proc> ps;
  for (size_t k = 0; k < sockets.size(); ++k) {
    std::vector<std::string> argv = {TrainerBinary(),
                                     "--socket",
                                     sockets[k],
                                     "--job",
                                     job,
                                     "--local-rank",
                                     "0",
                                     "--local-world-size",
                                     "1",
                                     "--num-nodes",
                                     absl::StrCat(sockets.size())};
    argv.insert(argv.end(), extra.begin(), extra.end());
    ps.push_back(Spawn(absl::StrCat(job, ".node", k), argv));
  }
  return WaitAll(ps, timeout);
}

void GraddTest::ExpectKilledTrainerFailsItsJob(
    const std::vector<std::string>& flags, milliseconds timeout) {
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), flags.begin(), flags.end());
    return extra;
  };
  Proc r0 = SpawnTrainer("killed", 0, 2, with({"--iterations", "1000"}));
  Proc r1 = SpawnTrainer(
      "killed", 1, 2,
      with({"--iterations", "1000", "--mode", "stall", "--stall-at", "3"}));
  ASSERT_TRUE(WaitForText(r1, "STALLED", timeout)) << ReadFile(r1.log);
  ASSERT_EQ(kill(r1.pid, SIGKILL), 0);
  Exit e = Wait(r0, timeout);
  EXPECT_EQ(e.code, 3) << e.output;
  EXPECT_NE(e.output.find("ERROR code="), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("local rank 1"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("iteration 3"), std::string::npos) << e.output;
  Wait(r1, milliseconds(5000));
  std::vector<Exit> next =
      RunJob("after-kill", 2, with({"--iterations", "10"}), timeout);
  for (const Exit& x : next) EXPECT_EQ(x.code, 0) << x.output;
}

std::string ReportedValue(const std::string& output, const std::string& key) {
  const size_t at = output.find(" " + key + "=");
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size() + 2;
  const size_t end = output.find_first_of(" \n", begin);
  return output.substr(begin, end - begin);
}

long ReportedNumber(const std::string& output, const std::string& key) {
  const size_t at = output.find(key + "=");
  if (at == std::string::npos) return -1;
  return std::strtol(output.c_str() + at + key.size() + 1, nullptr, 10);
}

std::vector<int> ReportedInts(const std::string& csv) {
  std::vector<int> out;
  for (absl::string_view s : absl::StrSplit(csv, ',', absl::SkipEmpty())) {
    int v = 0;
    EXPECT_TRUE(absl::SimpleAtoi(s, &v)) << s;
    out.push_back(v);
  }
  return out;
}

int ExpectBucketsFollow(const std::string& plan, const std::vector<int>& order,
                        const std::string& whose) {
  std::vector<size_t> position(order.size());
  for (size_t k = 0; k < order.size(); ++k) position[order[k]] = k;
  int buckets = 0;
  for (absl::string_view bucket : absl::StrSplit(plan, '|')) {
    ++buckets;
    const std::vector<int> params = ReportedInts(std::string(bucket));
    for (size_t k = 1; k < params.size(); ++k) {
      EXPECT_LT(position[params[k - 1]], position[params[k]])
          << "bucket " << bucket << " is not in " << whose << " order";
    }
  }
  return buckets;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace gradd::testing
