#include "tests/integration/etcd_cluster.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace gradd::testing {

std::string EtcdBinary() {
  const char* env = std::getenv("GRADD_TEST_ETCD_BINARY");
  return env != nullptr && *env != '\0' ? env : kEtcdBinary;
}

bool HaveEtcd() { return ::access(EtcdBinary().c_str(), X_OK) == 0; }

std::unique_ptr<EtcdCluster> EtcdCluster::Start(const Options& options) {
  if (!HaveEtcd()) {
    ADD_FAILURE() << EtcdBinary()
                  << " is missing or not executable: scripts/setup installs "
                     "etcd-server";
    return nullptr;
  }
  if (options.members < 1 || options.dir.empty()) {
    ADD_FAILURE() << "EtcdCluster needs at least one member and a directory";
    return nullptr;
  }
  if (options.tls && options.certs_dir.empty()) {
    ADD_FAILURE() << "EtcdCluster with tls needs certs_dir (MakeTestCerts)";
    return nullptr;
  }
  std::unique_ptr<EtcdCluster> c(new EtcdCluster(options));
  for (int i = 0; i < options.members; ++i) {
    Member m;
    m.name = absl::StrCat("m", i);
    m.client_port = FreePort();
    m.peer_port = FreePort();
    c->members_.push_back(m);
  }
  // On any failure `c` goes out of scope and SIGKILLs what did start.
  for (int i = 0; i < options.members; ++i) {
    if (!c->Launch(i, true)) return nullptr;
  }
  for (int i = 0; i < options.members; ++i) {
    if (!c->WaitHealthy(i)) return nullptr;
  }
  return c;
}

EtcdCluster::~EtcdCluster() {
  for (int i = 0; i < static_cast<int>(members_.size()); ++i) Kill(i);
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (const Member& m : members_) {
    out.push_back(absl::StrCat("127.0.0.1:", m.client_port));
  }
  return out;
}

EtcdClient::Options EtcdCluster::ClientOptions() const {
  EtcdClient::Options o;
  o.endpoints = endpoints();
  if (options_.tls) {
    o.tls.ca_pem = ReadFile(options_.certs_dir + "/ca.crt");
    o.tls.cert_pem = ReadFile(options_.certs_dir + "/node.crt");
    o.tls.key_pem = ReadFile(options_.certs_dir + "/node.key");
  }
  return o;
}

std::string EtcdCluster::LogPath(int i) const {
  return absl::StrCat(options_.dir, "/", members_[i].name, ".log");
}

std::string EtcdCluster::LogTail(int i) const {
  std::string log = ReadFile(LogPath(i));
  if (log.empty()) return "(empty)";
  if (log.size() > 3000) log = log.substr(log.size() - 3000);
  return log;
}

bool EtcdCluster::Launch(int i, bool initial) {
  const Member& m = members_[i];
  const std::string scheme = options_.tls ? "https" : "http";
  std::vector<std::string> cluster;
  for (const Member& other : members_) {
    cluster.push_back(
        absl::StrCat(other.name, "=http://127.0.0.1:", other.peer_port));
  }
  const std::string client_url =
      absl::StrCat(scheme, "://127.0.0.1:", m.client_port);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", m.peer_port);
  const std::string binary = EtcdBinary();
  std::vector<std::string> args = {
      binary,
      "--name",
      m.name,
      "--data-dir",
      absl::StrCat(options_.dir, "/", m.name, ".data"),
      "--listen-client-urls",
      client_url,
      "--advertise-client-urls",
      client_url,
      "--listen-peer-urls",
      peer_url,
      "--initial-advertise-peer-urls",
      peer_url,
      "--initial-cluster",
      absl::StrJoin(cluster, ","),
      "--initial-cluster-state",
      initial ? "new" : "existing",
      "--initial-cluster-token",
      absl::StrCat("gradd-test-", getpid()),
      // Short elections: a killed member's leadership moves quickly.
      "--heartbeat-interval",
      "50",
      "--election-timeout",
      "500",
  };
  if (options_.tls) {
    for (const std::string& a :
         {std::string("--cert-file=") + options_.certs_dir + "/node.crt",
          std::string("--key-file=") + options_.certs_dir + "/node.key",
          std::string("--trusted-ca-file=") + options_.certs_dir + "/ca.crt",
          std::string("--client-cert-auth")}) {
      args.push_back(a);
    }
  }
  const std::string log = LogPath(i);
  const pid_t pid = fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork failed";
    return false;
  }
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    dprintf(2, "execv %s: %s\n", binary.c_str(), strerror(errno));
    _exit(127);
  }
  members_[i].pid = pid;
  return true;
}

bool EtcdCluster::WaitHealthy(int i) {
  EtcdClient::Options o = ClientOptions();
  o.endpoints = {endpoints()[i]};
  o.retry_timeout = absl::Seconds(2);
  o.rpc_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(o);
  if (!client.ok()) {
    ADD_FAILURE() << client.status();
    return false;
  }
  const absl::Time deadline = absl::Now() + options_.startup_timeout;
  absl::Status last;
  while (absl::Now() < deadline) {
    etcdserverpb::RangeRequest r;
    r.set_key("health");
    absl::StatusOr<etcdserverpb::RangeResponse> got = (*client)->Range(r);
    if (got.ok()) return true;
    last = got.status();
    int status = 0;
    if (::waitpid(members_[i].pid, &status, WNOHANG) == members_[i].pid) {
      members_[i].pid = -1;
      ADD_FAILURE()
          << "etcd member " << members_[i].name << " (" << EtcdBinary() << ") "
          << (WIFEXITED(status)
                  ? absl::StrCat("exited with status ", WEXITSTATUS(status))
                  : absl::StrCat("was killed by signal ", WTERMSIG(status)))
          << " before answering; its log " << LogPath(i) << ":\n"
          << LogTail(i);
      return false;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  ADD_FAILURE() << "etcd member " << members_[i].name << " (" << EtcdBinary()
                << ") did not answer within "
                << absl::FormatDuration(options_.startup_timeout) << ": "
                << last << "\nits log " << LogPath(i) << ":\n"
                << LogTail(i);
  return false;
}

bool EtcdCluster::EnableAuth(const std::string& user,
                             const std::string& password) {
  if (options_.tls || members_.empty()) {
    ADD_FAILURE() << "EnableAuth: plaintext clusters only";
    return false;
  }
  auto channel =
      grpc::CreateChannel(endpoints()[0], grpc::InsecureChannelCredentials());
  auto auth = etcdserverpb::Auth::NewStub(channel);
  auto call = [&](const char* what, auto method, const auto& request,
                  auto* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    grpc::Status s = (auth.get()->*method)(&context, request, response);
    if (!s.ok()) {
      ADD_FAILURE() << "etcd " << what << ": " << s.error_message();
    }
    return s.ok();
  };
  etcdserverpb::AuthRoleAddRequest role;
  role.set_name("root");
  etcdserverpb::AuthRoleAddResponse role_added;
  if (!call("RoleAdd", &etcdserverpb::Auth::Stub::RoleAdd, role, &role_added)) {
    return false;
  }
  // etcd enables authentication only once a user named root exists.
  std::vector<std::string> users = {"root"};
  if (user != "root") users.push_back(user);
  for (const std::string& name : users) {
    etcdserverpb::AuthUserAddRequest add;
    add.set_name(name);
    add.set_password(password);
    etcdserverpb::AuthUserAddResponse added;
    etcdserverpb::AuthUserGrantRoleRequest grant;
    grant.set_user(name);
    grant.set_role("root");
    etcdserverpb::AuthUserGrantRoleResponse granted;
    if (!call("UserAdd", &etcdserverpb::Auth::Stub::UserAdd, add, &added) ||
        !call("UserGrantRole", &etcdserverpb::Auth::Stub::UserGrantRole, grant,
              &granted)) {
      return false;
    }
  }
  etcdserverpb::AuthEnableResponse enabled;
  return call("AuthEnable", &etcdserverpb::Auth::Stub::AuthEnable,
              etcdserverpb::AuthEnableRequest(), &enabled);
}

void EtcdCluster::Kill(int i) {
  if (i < 0 || i >= static_cast<int>(members_.size())) {
    ADD_FAILURE() << "no etcd member " << i;
    return;
  }
  Member& m = members_[i];
  if (m.pid <= 0) return;
  ::kill(m.pid, SIGKILL);
  ::waitpid(m.pid, nullptr, 0);
  m.pid = -1;
}

bool EtcdCluster::Restart(int i) {
  if (i < 0 || i >= static_cast<int>(members_.size())) {
    ADD_FAILURE() << "no etcd member " << i;
    return false;
  }
  Kill(i);
  // Its data directory holds the membership: it rejoins as itself.
  return Launch(i, true) && WaitHealthy(i);
}

}  // namespace gradd::testing
