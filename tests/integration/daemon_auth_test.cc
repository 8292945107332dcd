// Credentials between daemons with real gradd processes (issues 20, 34): a
// daemon configured for multi-node use - with the built-in store or on
// etcd, whose own credentials are not the daemons' - refuses to start
// without credentials unless told `insecure` (and then says so in its log
// and its status); a daemon without them refuses multi-node jobs at once
// instead of opening a port; a stranger on the network - a raw gRPC client
// or a whole daemon with the wrong token - gets nothing from a real
// coordinator whose jobs keep running; and on etcd a raw etcd client without
// the cluster's client certificate neither reads nor writes a running
// job's keys (its Gloo pair key among them). The daemons here use a shared
// token; the multi-node suite runs with a token and with mutual TLS, on
// both backends (multinode_test, multinode_test.mtls).
//
// Suites: DaemonAuthTest runs on both backends
// (Backends/DaemonAuthTest.<name>/{builtin,etcd}); CoordinatorAuthTest is
// the built-in coordinator's own checks, EtcdAuthTest etcd's.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gradd/v1/admin.grpc.pb.h"
#include "gradd/v1/rendezvous.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/rendezvous/etcd/etcd_client.h"
#include "tests/integration/etcd_cluster.h"
#include "tests/integration/harness.h"
#include "tests/integration/node_cluster.h"

namespace gradd::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Whether something accepts TCP connections on 127.0.0.1:`port`.
bool Listening(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string Network(const std::string& socket) {
  auto stub = v1::Admin::NewStub(grpc::CreateChannel(
      "unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::GetStatusResponse status;
  const grpc::Status s = stub->GetStatus(&context, {}, &status);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return status.network_security();
}

// The daemons' credentials here are a shared token: the expectations below
// are a token's (UNAUTHENTICATED, not a failed TLS handshake).
class DaemonAuthFixture : public NodeClusterTest {
 protected:
  explicit DaemonAuthFixture(Backend backend)
      : NodeClusterTest(backend, "gradd-auth-") {
    setenv("GRADD_TEST_NODE_AUTH", "token", 1);
  }

  // Starts a gradd that must come up on <dir>/<name>/gradd.sock.
  Proc StartGradd(const std::string& name,
                  const std::vector<std::string>& flags) {
    const std::string socket = absl::StrCat(dir_, "/", name, "/gradd.sock");
    std::vector<std::string> argv = {DaemonBinary(), "--socket", socket,
                                     "--node-id", name};
    argv.insert(argv.end(), flags.begin(), flags.end());
    Proc p = Spawn(name, argv);
    procs_.pop_back();  // stopped below with SIGTERM, not SIGKILLed
    // On etcd the daemon's lease comes first.
    EXPECT_TRUE(
        WaitForText(p, "gradd listening on",
                    milliseconds(backend_ == Backend::kEtcd ? 30000 : 10000)))
        << ReadFile(p.log);
    return p;
  }

  void Stop(Proc& p) {
    kill(p.pid, SIGTERM);
    Exit e = Wait(p, milliseconds(10000));
    EXPECT_EQ(e.code, 0) << e.output;
  }

  // Two daemons, node-a and node-b, and a job the cluster formed on them,
  // "secret-job" (one trainer per node), that runs until the test ends:
  // its keys stay in the store while it runs. Fatal if the trainers do not
  // attach.
  void StartClusterWithRunningJob(std::vector<Proc>* trainers) {
    NodeConfig config;
    config.expected_node_ids = "";
    ASSERT_TRUE(StartNodes({"node-a", "node-b"}, WriteNodeConfig(config)));
    *trainers = StartJob("secret-job", {{"node-a", 1}, {"node-b", 1}},
                         {"--iterations", "1000000", "--sleep-ms", "5"});
    for (const Proc& p : *trainers) {
      ASSERT_TRUE(WaitForText(p, "ATTACHED", milliseconds(30000)))
          << ReadFile(p.log);
    }
  }

  // The cluster's own job never noticed the strangers: it is still
  // running, and the daemons form new jobs as before.
  void ExpectClusterUndisturbed(const std::vector<Proc>& trainers) {
    for (const Proc& p : trainers) {
      EXPECT_EQ(kill(p.pid, 0), 0) << ReadFile(p.log);
    }
    std::vector<Exit> after =
        RunOneTrainerPerNode(NodeSockets(), "after-strangers",
                             {"--iterations", "3"}, milliseconds(60000));
    for (const Exit& e : after) EXPECT_EQ(e.code, 0) << e.output;
  }
};

// A daemon's credentials for the other daemons, on both backends: on etcd
// the store is etcd's, but the daemons still connect to each other's Gloo
// pairs and need credentials of their own for that.
class DaemonAuthTest : public DaemonAuthFixture,
                       public ::testing::WithParamInterface<Backend> {
 protected:
  DaemonAuthTest() : DaemonAuthFixture(GetParam()) {}
};

INSTANTIATE_TEST_SUITE_P(Backends, DaemonAuthTest, BothBackends(), BackendName);

// The built-in coordinator's own checks, built-in only: on etcd no daemon
// serves the store (etcd's client certificates keep strangers out of it:
// EtcdAuthTest), and no daemon on etcd runs without credentials for the
// others (DaemonAuthTest), so none discovers a coordinator without them.
class CoordinatorAuthTest : public DaemonAuthFixture {
 protected:
  CoordinatorAuthTest() : DaemonAuthFixture(Backend::kBuiltin) {}
};

// etcd only: a one-member etcd demanding client certificates of the test
// CA (etcd --client-cert-auth), which the daemons have.
class EtcdAuthTest : public DaemonAuthFixture {
 protected:
  EtcdAuthTest() : DaemonAuthFixture(Backend::kEtcd) {}
};

TEST_P(DaemonAuthTest, AMultiNodeDaemonWithoutCredentialsRefusesToStart) {
  // What makes a daemon multi-node, and the flags of the daemons that do
  // start below: with the built-in store, serving it, naming a coordinator
  // or the cluster's nodes; on etcd, the backend itself (the config has
  // etcd's client certificate, which is no credential for the other
  // daemons), with or without the nodes.
  std::vector<std::vector<std::string>> multi_node;
  std::vector<std::string> starts;
  if (GetParam() == Backend::kBuiltin) {
    multi_node = {{"--rendezvous-listen", "127.0.0.1:0"},
                  {"--coordinator", "127.0.0.1:29600"},
                  {"--expected-nodes", "node-a,node-b"}};
    starts = {"--rendezvous-listen", "127.0.0.1:0"};
  } else {
    NodeConfig etcd_only;
    etcd_only.name = "etcd-only";
    etcd_only.expected_node_ids = "";
    const std::string config = WriteNodeConfig(etcd_only);
    multi_node = {{"--config", config},
                  {"--config", config, "--expected-nodes", "node-a,node-b"}};
    starts = {"--config", config};
  }
  for (const std::vector<std::string>& flags : multi_node) {
    const std::string socket = dir_ + "/refused/gradd.sock";
    std::vector<std::string> argv = {DaemonBinary(), "--socket", socket};
    argv.insert(argv.end(), flags.begin(), flags.end());
    Proc p = Spawn("refused", argv);
    Exit e = Wait(p, milliseconds(10000));
    const std::string which = absl::StrJoin(flags, " ");
    EXPECT_EQ(e.code, 2) << which << ":\n" << e.output;
    EXPECT_THAT(e.output, AllOf(HasSubstr("makes this a multi-node daemon"),
                                HasSubstr("rendezvous.token_file"),
                                HasSubstr("rendezvous.tls"),
                                HasSubstr("rendezvous.insecure: true")))
        << which;
    if (GetParam() == Backend::kEtcd && flags.size() == 2) {
      EXPECT_THAT(e.output, HasSubstr("rendezvous.backend: etcd makes this a "
                                      "multi-node daemon"))
          << which;
    }
    EXPECT_FALSE(Exists(socket)) << which;
  }
  auto with = [&](std::vector<std::string> flags) {
    flags.insert(flags.begin(), starts.begin(), starts.end());
    return flags;
  };
  // Which store the daemons that start use, as their logs say.
  const std::string backend =
      GetParam() == Backend::kEtcd
          ? absl::StrCat("rendezvous backend etcd at ",
                         cluster_->endpoints()[0])
          : std::string("rendezvous backend builtin, coordinator ");

  // Explicitly insecure: it runs, and says so in its log and its status.
  Proc insecure = StartGradd("insecure", with({"--rendezvous-insecure"}));
  EXPECT_THAT(ReadFile(insecure.log),
              HasSubstr("daemon network: INSECURE (rendezvous.insecure: "
                        "true)"));
  EXPECT_THAT(ReadFile(insecure.log), HasSubstr(backend));
  EXPECT_THAT(Network(dir_ + "/insecure/gradd.sock"), HasSubstr("INSECURE"));
  Stop(insecure);

  // With a token: the status names it, never the token itself.
  const std::string token = dir_ + "/token";
  std::ofstream(token) << "0123456789abcdef0123456789abcdef\n";
  chmod(token.c_str(), 0600);
  Proc secured =
      StartGradd("secured", with({"--rendezvous-token-file", token}));
  EXPECT_EQ(Network(dir_ + "/secured/gradd.sock"),
            "token (calls not encrypted)");
  EXPECT_THAT(ReadFile(secured.log), HasSubstr(backend));
  EXPECT_THAT(ReadFile(secured.log),
              Not(HasSubstr("0123456789abcdef0123456789abcdef")));
  Stop(secured);
}

TEST_F(CoordinatorAuthTest,
       WithoutCredentialsAMultiNodeJobFailsAtOnceNamingKeys) {
  // Daemons as a fresh install is (coordinator discovery), no credentials.
  const int port = FreePort();
  ASSERT_GT(port, 0);
  Proc a = StartGradd("host0", {"--rendezvous-port", absl::StrCat(port)});
  Proc b = StartGradd("host1", {"--rendezvous-port", absl::StrCat(port)});
  EXPECT_THAT(Network(dir_ + "/host0/gradd.sock"),
              HasSubstr("multi-node jobs refused"));
  const absl::Time start = absl::Now();
  std::vector<Exit> exits = RunOneTrainerPerNode(
      {dir_ + "/host0/gradd.sock", dir_ + "/host1/gradd.sock"}, "two-nodes",
      {"--iterations", "2", "--coordinator", "127.0.0.1"}, milliseconds(30000));
  // Far below the 60 s formation timeout: refused, not timed out.
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  for (const Exit& e : exits) {
    EXPECT_EQ(e.code, 3) << e.output;
    EXPECT_THAT(e.output,
                AllOf(HasSubstr("spans 2 nodes but this daemon has no "
                                "credentials"),
                      HasSubstr("rendezvous.token_file"),
                      HasSubstr("rendezvous.insecure: true")))
        << e.output;
  }
  // No port was opened for the store.
  EXPECT_FALSE(Listening(port));
  // Single-node jobs need nothing.
  std::vector<Exit> single =
      RunOneTrainerPerNode({dir_ + "/host0/gradd.sock"}, "one-node",
                           {"--iterations", "3"}, milliseconds(30000));
  EXPECT_EQ(single[0].code, 0) << single[0].output;
  Stop(a);
  Stop(b);
}

// A raw client of the coordinator's store, as a stranger would write one.
class Stranger {
 public:
  Stranger(const std::string& address, const std::string& token)
      : token_(token),
        stub_(v1::Rendezvous::NewStub(grpc::CreateChannel(
            address, grpc::InsecureChannelCredentials()))) {}

  grpc::Status Get(const std::string& job, const std::string& key) {
    grpc::ClientContext context;
    Prepare(&context);
    v1::RendezvousGetRequest request;
    request.set_job_id(job);
    request.set_key(key);
    request.set_wait_timeout_ms(200);
    v1::RendezvousGetResponse response;
    return stub_->Get(&context, request, &response);
  }
  // `timeout`: how long the call may take (a large value on a loaded
  // machine needs more than the default to even arrive).
  grpc::Status Set(const std::string& job, const std::string& key,
                   const std::string& value,
                   absl::Duration timeout = absl::Seconds(5)) {
    grpc::ClientContext context;
    Prepare(&context, timeout);
    v1::RendezvousSetRequest request;
    request.set_job_id(job);
    request.set_key(key);
    request.set_value(value);
    v1::RendezvousSetResponse response;
    return stub_->Set(&context, request, &response);
  }
  grpc::Status Add(const std::string& job, const std::string& key) {
    grpc::ClientContext context;
    Prepare(&context);
    v1::RendezvousAddRequest request;
    request.set_job_id(job);
    request.set_key(key);
    request.set_delta(1);
    v1::RendezvousAddResponse response;
    return stub_->Add(&context, request, &response);
  }

 private:
  void Prepare(grpc::ClientContext* context,
               absl::Duration timeout = absl::Seconds(5)) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (!token_.empty())
      context->AddMetadata("authorization", "Bearer " + token_);
  }
  std::string token_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
};

TEST_F(CoordinatorAuthTest, AStrangerGetsNothingFromARealCoordinator) {
  std::vector<Proc> keeps;
  ASSERT_NO_FATAL_FAILURE(StartClusterWithRunningJob(&keeps));
  const std::string coordinator = coordinator_;

  for (const std::string& token :
       {std::string(), std::string("a-guessed-token-0123456789")}) {
    Stranger stranger(coordinator, token);
    const std::string why =
        token.empty() ? "presented no token" : "presented a wrong token";
    for (const grpc::Status& s :
         {stranger.Get("secret-job", "round1/member/node-0"),
          stranger.Get("secret-job", "round1/plan"),
          stranger.Set("secret-job", "round1/plan", "poisoned"),
          stranger.Set("secret-job", "round2/closed", "used up"),
          stranger.Add("secret-job", "round1/joined"),
          stranger.Set("bloat", "k", std::string(16 << 20, 'x'))}) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << s.error_message();
      EXPECT_THAT(s.error_message(), HasSubstr(why));
    }
  }
  // The coordinator logged the refusals, naming the caller.
  EXPECT_TRUE(WaitForText(Node("node-a").proc, "refused: it presented no token",
                          milliseconds(5000)))
      << ReadFile(Node("node-a").proc.log);

  // A whole daemon with the wrong token cannot join a job.
  const std::string wrong = dir_ + "/wrong-token";
  std::ofstream(wrong) << "not-the-cluster-token-0123456789\n";
  chmod(wrong.c_str(), 0600);
  Proc impostor = StartGradd("impostor", {"--coordinator", coordinator,
                                          "--rendezvous-token-file", wrong});
  Proc joiner =
      Spawn("impostor-trainer",
            {TrainerBinary(), "--socket", dir_ + "/impostor/gradd.sock",
             "--job", "secret-job-2", "--local-rank", "0", "--local-world-size",
             "1", "--num-nodes", "2", "--node-rank", "0", "--iterations", "2"});
  Exit joined = Wait(joiner, milliseconds(30000));
  EXPECT_EQ(joined.code, 3) << joined.output;
  EXPECT_THAT(joined.output, AllOf(HasSubstr("ERROR code=16"),
                                   HasSubstr("presented a wrong token")))
      << joined.output;
  Stop(impostor);

  ExpectClusterUndisturbed(keeps);
}

// A raw etcd v3 client, as a stranger would write one: plaintext, or TLS
// trusting etcd's CA with `cert_pem`/`key_pem` as its client certificate
// (none when empty).
class EtcdStranger {
 public:
  static EtcdStranger Plaintext(const std::string& endpoint) {
    return EtcdStranger(endpoint, grpc::InsecureChannelCredentials());
  }
  static EtcdStranger Tls(const std::string& endpoint,
                          const std::string& ca_pem,
                          const std::string& cert_pem = "",
                          const std::string& key_pem = "") {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = ca_pem;
    tls.pem_cert_chain = cert_pem;
    tls.pem_private_key = key_pem;
    return EtcdStranger(endpoint, grpc::SslCredentials(tls));
  }

  // Reads `key`, or every key from `key` on when `prefix`.
  grpc::Status Read(const std::string& key, bool prefix = false) {
    etcdserverpb::RangeRequest request;
    request.set_key(key);
    if (prefix) request.set_range_end(EtcdPrefixEnd(key));
    etcdserverpb::RangeResponse response;
    grpc::ClientContext context;
    Prepare(&context);
    return kv_->Range(&context, request, &response);
  }
  grpc::Status Write(const std::string& key, const std::string& value) {
    etcdserverpb::PutRequest request;
    request.set_key(key);
    request.set_value(value);
    etcdserverpb::PutResponse response;
    grpc::ClientContext context;
    Prepare(&context);
    return kv_->Put(&context, request, &response);
  }
  // Overwrites `key` in a transaction, as a compare-and-swap would.
  grpc::Status Swap(const std::string& key, const std::string& value) {
    etcdserverpb::TxnRequest request;
    etcdserverpb::PutRequest* put =
        request.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(value);
    etcdserverpb::TxnResponse response;
    grpc::ClientContext context;
    Prepare(&context);
    return kv_->Txn(&context, request, &response);
  }
  grpc::Status DeletePrefix(const std::string& prefix) {
    etcdserverpb::DeleteRangeRequest request;
    request.set_key(prefix);
    request.set_range_end(EtcdPrefixEnd(prefix));
    etcdserverpb::DeleteRangeResponse response;
    grpc::ClientContext context;
    Prepare(&context);
    return kv_->DeleteRange(&context, request, &response);
  }

 private:
  EtcdStranger(const std::string& endpoint,
               std::shared_ptr<grpc::ChannelCredentials> credentials)
      : kv_(etcdserverpb::KV::NewStub(
            grpc::CreateChannel(endpoint, credentials))) {}
  static void Prepare(grpc::ClientContext* context) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
  }
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
};

// Every key under `prefix` and its value, as the daemons' own client
// (the test CA's certificate) reads them; empty with a failure on an error.
std::map<std::string, std::string> ReadPrefix(EtcdClient& client,
                                              const std::string& prefix) {
  etcdserverpb::RangeRequest request;
  request.set_key(prefix);
  request.set_range_end(EtcdPrefixEnd(prefix));
  absl::StatusOr<etcdserverpb::RangeResponse> got = client.Range(request);
  std::map<std::string, std::string> out;
  if (!got.ok()) {
    ADD_FAILURE() << got.status();
    return out;
  }
  for (const mvccpb::KeyValue& kv : got->kvs()) out[kv.key()] = kv.value();
  return out;
}

// Issue 34, point 4: on etcd the job's keys - its Gloo pair key among them
// - are etcd's to guard. A stranger who reaches etcd's port but has no
// client certificate of the cluster's CA (plaintext, TLS without a
// certificate, a certificate of another CA) can neither read nor write
// them, nor anything else there; etcd refuses it at the handshake and logs
// it; the job formed on them never notices, and the daemons form new jobs.
TEST_F(EtcdAuthTest, AStrangerWithoutEtcdCredentialsGetsNothingFromTheJob) {
  std::vector<Proc> keeps;
  ASSERT_NO_FATAL_FAILURE(StartClusterWithRunningJob(&keeps));
  absl::StatusOr<std::unique_ptr<EtcdClient>> created =
      EtcdClient::Create(cluster_->ClientOptions());
  ASSERT_TRUE(created.ok()) << created.status();
  EtcdClient& daemons_client = **created;
  // The running job's keys, once its Gloo mesh's pair key is there.
  const std::string job = "/gradd-test/jobs/secret-job/";
  std::map<std::string, std::string> before;
  std::string pair_key;
  for (const auto deadline =
           std::chrono::steady_clock::now() + std::chrono::seconds(30);
       pair_key.empty() && std::chrono::steady_clock::now() < deadline;) {
    before = ReadPrefix(daemons_client, job);
    for (const auto& [key, value] : before) {
      if (absl::EndsWith(key, "/pairkey")) pair_key = key;
    }
    if (pair_key.empty()) std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_FALSE(pair_key.empty()) << "no pair key under " << job;
  RecordProperty("job_keys", static_cast<int>(before.size()));

  const std::string endpoint = cluster_->endpoints()[0];
  const std::string certs = TestCerts();
  const std::string ca = ReadFile(certs + "/ca.crt");
  struct Who {
    std::string name;
    EtcdStranger client;
  };
  Who strangers[] = {
      {"a plaintext client", EtcdStranger::Plaintext(endpoint)},
      {"a TLS client without a certificate", EtcdStranger::Tls(endpoint, ca)},
      {"a client with another CA's certificate",
       EtcdStranger::Tls(endpoint, ca, ReadFile(certs + "/stranger.crt"),
                         ReadFile(certs + "/stranger.key"))},
  };
  for (Who& who : strangers) {
    for (const grpc::Status& s :
         {who.client.Read(pair_key), who.client.Read(job, /*prefix=*/true),
          who.client.Read("/", /*prefix=*/true),
          who.client.Write(pair_key, "poisoned"),
          who.client.Write(job + "forged", "poisoned"),
          who.client.Swap(pair_key, "poisoned"),
          who.client.DeletePrefix(job)}) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE)
          << who.name << ": " << s.error_message();
    }
  }
  // etcd refused each of them at the TLS handshake, and logged it.
  auto rejections = [&] {
    const std::string log = ReadFile(cluster_->LogPath(0));
    int n = 0;
    for (size_t at = log.find("rejected connection"); at != std::string::npos;
         at = log.find("rejected connection", at + 1)) {
      ++n;
    }
    return n;
  };
  for (const auto deadline =
           std::chrono::steady_clock::now() + std::chrono::seconds(5);
       rejections() < 3 && std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_GE(rejections(), 3) << cluster_->LogTail(0);

  // Nothing they sent landed: the pair key is still there (not deleted)
  // and still the daemons', no key was forged and no value poisoned.
  const std::map<std::string, std::string> after =
      ReadPrefix(daemons_client, job);
  ASSERT_TRUE(after.count(pair_key)) << pair_key << " is gone";
  EXPECT_EQ(after.at(pair_key), before.at(pair_key));
  EXPECT_FALSE(after.count(job + "forged"));
  for (const auto& [key, value] : ReadPrefix(daemons_client, "/")) {
    EXPECT_NE(value, "poisoned") << key;
  }
  ExpectClusterUndisturbed(keeps);
  for (const char* node : {"node-a", "node-b"}) {
    EXPECT_THAT(ReadFile(Node(node).proc.log),
                Not(HasSubstr("job 'secret-job' failed")))
        << node;
  }
}

// Resident memory of process `pid` in MiB (VmRSS), -1 if unreadable.
long RssMiB(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string text;
  while (std::getline(in, text)) {
    absl::string_view line = text;
    long kb = 0;
    if (absl::ConsumePrefix(&line, "VmRSS:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::StripSuffix(
                             absl::StripAsciiWhitespace(line), "kB")),
                         &kb)) {
      return kb / 1024;
    }
  }
  return -1;
}

// The bloating attack on memory itself: a stranger's requests are refused,
// but gRPC received them whole first. Measured: 16 concurrent 31 MiB
// requests, five times, left a coordinator at 940 MB without the heap
// trimmer (heap_trimmer.h); with it the coordinator gives the memory back.
TEST_F(CoordinatorAuthTest,
       AStrangersRefusedRequestsDoNotStayInTheCoordinator) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP()
      << "AddressSanitizer's allocator replaces malloc: freed memory "
         "is quarantined, and the daemon's RSS cannot fall back (malloc_trim)";
#endif
  const std::string token = dir_ + "/token";
  std::ofstream(token) << "0123456789abcdef0123456789abcdef\n";
  chmod(token.c_str(), 0600);
  const std::string port_file = dir_ + "/coord.port";
  Proc coordinator = StartGradd(
      "coord", {"--rendezvous-listen", "127.0.0.1:0", "--rendezvous-port-file",
                port_file, "--rendezvous-token-file", token});
  int port = 0;
  ASSERT_TRUE(
      absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(port_file)), &port));
  const long start = RssMiB(coordinator.pid);
  ASSERT_GT(start, 0);
  for (int round = 0; round < 4; ++round) {
    std::vector<std::thread> senders;
    for (int i = 0; i < 16; ++i) {
      senders.emplace_back([&, i] {
        Stranger stranger(absl::StrCat("127.0.0.1:", port), "");
        // 16 x 31 MiB at once: under a loaded CI machine they took more
        // than the default 5 s to arrive (DEADLINE_EXCEEDED, the refusal
        // never seen), so the calls get a minute; what is measured is the
        // memory after, not the time.
        grpc::Status s =
            stranger.Set(absl::StrCat("bloat", i), "k",
                         std::string(31 << 20, 'x'), absl::Seconds(60));
        EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
            << s.error_message();
      });
    }
    for (std::thread& t : senders) t.join();
  }
  // With glibc's thresholds fixed (HeapTrimmer::FixMallocThresholds) the
  // refused requests' blocks are unmapped when freed: measured 24-39 MiB
  // after each of 8 rounds, against 230-495 MiB with glibc's dynamic
  // thresholds (13 arenas each keeping a 31 MiB top chunk, which
  // malloc_trim does not shrink). The bound is a quarter of one round's
  // 496 MiB; the wait covers a loaded machine tearing the calls down late.
  long after = RssMiB(coordinator.pid);
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (after - start >= 128 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(500));
    after = RssMiB(coordinator.pid);
  }
  EXPECT_LT(after - start, 128)
      << "coordinator RSS " << start << " MiB -> " << after << " MiB";
  Stop(coordinator);
}

}  // namespace
}  // namespace gradd::testing
