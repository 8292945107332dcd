// The daemon <-> daemon plane under attack (issue 20): a stranger on the
// network - no credentials, or wrong ones - tries to read, write, poison,
// join and bloat the rendezvous store of a coordinator that demands a token
// or mutual TLS, through the real gRPC service on 127.0.0.1. Every attempt
// fails UNAUTHENTICATED (or at the TLS handshake) and leaves the store as it
// was; the daemons holding the credentials keep working. Also: credentials
// reloaded while the listener runs (SIGHUP), and a node outside
// rendezvous.expected_node_ids refused before it takes a formation slot.
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gradd/v1/rendezvous.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/auth/node_credentials.h"
#include "server/rendezvous/job_formation.h"
#include "server/rendezvous/kv_store.h"
#include "server/rendezvous/rendezvous_client.h"
#include "server/rendezvous/rendezvous_service.h"
#include "tests/unit/auth/test_certs.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "cluster-token-0123456789abcdef0123";
constexpr char kWrongToken[] = "stranger-token-0123456789abcdef01";

std::string Message(const absl::Status& s) { return std::string(s.message()); }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

v1::ParamSpec Param(const std::string& name) {
  v1::ParamSpec p;
  p.set_name(name);
  p.add_shape(4);
  p.set_dtype(v1::FLOAT32);
  return p;
}

class RendezvousAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTestCerts();
    ASSERT_FALSE(dir_.empty());
    ASSERT_TRUE(testing::WriteSecret(dir_ + "/token", kToken));
    ASSERT_TRUE(testing::WriteSecret(dir_ + "/wrong-token", kWrongToken));
  }
  void TearDown() override {
    server_.reset();
    testing::RemoveTree(dir_);
  }

  std::shared_ptr<NodeCredentials> Load(const std::string& token_file,
                                        const std::string& cert = "",
                                        const std::string& ca = "ca",
                                        const std::string& server_name = "") {
    NodeCredentialsOptions o;
    if (!token_file.empty()) o.token_file = dir_ + "/" + token_file;
    if (!cert.empty()) {
      o.tls = TlsFiles{dir_ + "/" + cert + ".crt", dir_ + "/" + cert + ".key",
                       dir_ + "/" + ca + ".crt"};
      o.tls_server_name = server_name;
    }
    auto creds = NodeCredentials::Load(o);
    EXPECT_TRUE(creds.ok()) << creds.status();
    return creds.ok() ? *creds : nullptr;
  }

  void Start(std::shared_ptr<NodeCredentials> creds,
             std::vector<std::string> expected = {}) {
    server_creds_ = creds;
    RendezvousServer::Options o;
    o.listen_address = "127.0.0.1:0";
    o.credentials = std::move(creds);
    o.expected_node_ids = std::move(expected);
    auto server = RendezvousServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<RendezvousClient> Client(
      std::shared_ptr<const NodeCredentials> creds,
      absl::Duration connect_timeout = absl::Seconds(10)) {
    RendezvousClient::Options o;
    o.address = server_->address();
    o.connect_timeout = connect_timeout;
    o.rpc_timeout = absl::Seconds(3);
    o.credentials = std::move(creds);
    auto client = RendezvousClient::Create(o);
    EXPECT_TRUE(client.ok());
    return *std::move(client);
  }

  // A job the cluster's daemons formed: what a stranger wants to read.
  void FormLegitimateJob(RendezvousStoreInterface& store) {
    ASSERT_TRUE(
        store.Set("job", "round1/member/node-a", "params: fc.weight").ok());
    ASSERT_TRUE(store.Set("job", "round1/plan", "bucket plan").ok());
    ASSERT_TRUE(store.Add("job", "round1/joined", 1).ok());
    keys_before_ = server_->store().NumKeys("job");
    bytes_before_ = server_->store().TotalBytes();
  }

  // The store holds exactly what the cluster put there.
  void ExpectStoreUntouched(RendezvousStoreInterface& legit) {
    EXPECT_EQ(server_->store().NumKeys("job"), keys_before_);
    EXPECT_EQ(server_->store().TotalBytes(), bytes_before_);
    EXPECT_EQ(server_->store().NumJobs(), 1u);
    absl::StatusOr<std::string> member =
        legit.Get("job", "round1/member/node-a", absl::Seconds(2));
    ASSERT_TRUE(member.ok()) << member.status();
    EXPECT_EQ(*member, "params: fc.weight");
  }

  // Every store operation a stranger could try, each expected to fail with
  // `code` and `why` in its message.
  void ExpectEveryCallRefused(RendezvousClient& stranger, absl::StatusCode code,
                              const std::string& why) {
    auto refused = [&](const absl::Status& s, const char* what) {
      EXPECT_EQ(s.code(), code) << what << ": " << s;
      EXPECT_THAT(Message(s), HasSubstr(why)) << what;
      EXPECT_THAT(Message(s),
                  AllOf(Not(HasSubstr(kToken)), Not(HasSubstr(kWrongToken))));
    };
    // Read the job's members, parameter names and plan.
    refused(
        stranger.Get("job", "round1/member/node-a", absl::Seconds(2)).status(),
        "Get");
    refused(stranger.Wait("job", {"round1/plan"}, absl::Seconds(2)), "Wait");
    // Write, delete and add in the job's namespace; close its rounds.
    refused(stranger.Set("job", "round1/plan", "poisoned"), "Set");
    refused(stranger.Delete("job", "round1/member/node-a").status(), "Delete");
    refused(stranger.Add("job", "round1/joined", 1).status(), "Add");
    for (int k = 2; k < 12; ++k) {
      refused(stranger.Set("job", absl::StrCat("round", k, "/closed"), "x"),
              "closing rounds");
    }
    refused(stranger.Release("job", "round1", "node-a", 1).status(), "Release");
    // Join a forming job as a fake node asking for node rank 0.
    JobFormationOptions fake;
    fake.job_id = "job";
    fake.node_id = "fake-node";
    fake.node_rank = 0;
    fake.num_nodes = 2;
    fake.params = {Param("fc.weight")};
    fake.timeout = absl::Seconds(2);
    fake.prefix = "round1/members";
    refused(FormJob(stranger, fake).status(), "FormJob");
    // Bloat the coordinator.
    for (int i = 0; i < 4; ++i) {
      refused(stranger.Set(absl::StrCat("bloat", i), "k",
                           std::string(4 << 20, 'x')),
              "bloat");
    }
  }

  std::string dir_;
  std::shared_ptr<NodeCredentials> server_creds_;
  std::unique_ptr<RendezvousServer> server_;
  size_t keys_before_ = 0;
  size_t bytes_before_ = 0;
};

TEST_F(RendezvousAuthTest, TokenStrangerWithoutCredentialsGetsNothingIn) {
  Start(Load("token"));
  auto legit = Client(Load("token"));
  FormLegitimateJob(*legit);
  auto stranger = Client(nullptr);
  ExpectEveryCallRefused(*stranger, absl::StatusCode::kUnauthenticated,
                         "presented no token");
  ExpectStoreUntouched(*legit);
}

TEST_F(RendezvousAuthTest, TokenStrangerWithAWrongTokenGetsNothingIn) {
  Start(Load("token"));
  auto legit = Client(Load("token"));
  FormLegitimateJob(*legit);
  auto stranger = Client(Load("wrong-token"));
  ExpectEveryCallRefused(*stranger, absl::StatusCode::kUnauthenticated,
                         "presented a wrong token");
  ExpectStoreUntouched(*legit);
}

TEST_F(RendezvousAuthTest, ANewTokenIsAcceptedAfterReloadAndTheOldDropped) {
  ASSERT_TRUE(testing::WriteSecret(dir_ + "/server-token", kToken));
  Start(Load("server-token"));
  auto old_token = Client(Load("token"));
  auto new_token = Client(Load("wrong-token"));
  ASSERT_TRUE(old_token->Set("job", "k", "v").ok());
  EXPECT_EQ(new_token->Set("job", "k", "v").code(),
            absl::StatusCode::kUnauthenticated);
  // Roll out: both accepted, then only the new one.
  ASSERT_TRUE(testing::WriteSecret(dir_ + "/server-token",
                                   absl::StrCat(kToken, "\n", kWrongToken)));
  ASSERT_TRUE(server_creds_->Reload().ok());
  EXPECT_TRUE(old_token->Set("job", "k", "v").ok());
  EXPECT_TRUE(new_token->Set("job", "k", "v").ok());
  ASSERT_TRUE(testing::WriteSecret(dir_ + "/server-token", kWrongToken));
  ASSERT_TRUE(server_creds_->Reload().ok());
  EXPECT_EQ(old_token->Set("job", "k", "v").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(new_token->Set("job", "k", "v").ok());
}

// A raw stub: what a stranger's own gRPC program would do.
std::unique_ptr<v1::Rendezvous::Stub> RawStub(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> c) {
  return v1::Rendezvous::NewStub(grpc::CreateChannel(address, c));
}

grpc::Status RawGet(v1::Rendezvous::Stub& stub) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  v1::RendezvousGetRequest request;
  request.set_job_id("job");
  request.set_key("round1/member/node-a");
  request.set_wait_timeout_ms(100);
  v1::RendezvousGetResponse response;
  return stub.Get(&context, request, &response);
}

TEST_F(RendezvousAuthTest, MutualTlsStrangersFailTheHandshake) {
  Start(Load("", "node"));
  // Another daemon of the cluster: its own certificate, the same CA, and
  // the name every certificate carries instead of the coordinator's IP.
  auto legit = Client(Load("", "node2", "ca", "gradd"));
  FormLegitimateJob(*legit);
  // Plaintext, TLS without a client certificate, a certificate from
  // another CA: none gets a call through.
  auto plaintext = Client(nullptr, absl::Seconds(1));
  const absl::Status s =
      plaintext->Get("job", "round1/member/node-a", absl::Seconds(1)).status();
  EXPECT_FALSE(s.ok());
  const absl::Status closed = plaintext->Set("job", "round1/plan", "poisoned");
  EXPECT_EQ(closed.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Message(closed), HasSubstr("rendezvous.tls"));  // the hint
  grpc::SslCredentialsOptions no_cert;
  no_cert.pem_root_certs = ReadAll(dir_ + "/ca.crt");
  auto anonymous = RawStub(server_->address(), grpc::SslCredentials(no_cert));
  EXPECT_FALSE(RawGet(*anonymous).ok());
  grpc::SslCredentialsOptions foreign = no_cert;
  foreign.pem_cert_chain = ReadAll(dir_ + "/stranger.crt");
  foreign.pem_private_key = ReadAll(dir_ + "/stranger.key");
  auto stranger = RawStub(server_->address(), grpc::SslCredentials(foreign));
  EXPECT_FALSE(RawGet(*stranger).ok());
  ExpectStoreUntouched(*legit);
  // A daemon checking for another name than the certificate's refuses the
  // coordinator: the client side verifies too.
  auto wrong_name =
      Client(Load("", "node2", "ca", "not-gradd"), absl::Seconds(1));
  // A TLS failure is not retried until the connect timeout: the call
  // fails at once, naming the keys to check.
  const absl::Time start = absl::Now();
  const absl::Status wrong = wrong_name->Set("job", "x", "y");
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(Message(wrong), AllOf(HasSubstr("not-gradd"),
                                    HasSubstr("rendezvous.tls.server_name")));
  EXPECT_EQ(server_->store().NumKeys("job"), keys_before_);
}

TEST_F(RendezvousAuthTest, MutualTlsWithATokenNeedsBoth) {
  Start(Load("token", "node"));
  auto legit = Client(Load("token", "node2", "ca", "gradd"));
  FormLegitimateJob(*legit);
  auto cert_only = Client(Load("", "node2", "ca", "gradd"));
  ExpectEveryCallRefused(*cert_only, absl::StatusCode::kUnauthenticated,
                         "presented no token");
  ExpectStoreUntouched(*legit);
}

// SIGHUP: the running listener's next handshakes use the reloaded CA.
TEST_F(RendezvousAuthTest, AReloadedCaReachesTheRunningListener) {
  const std::string ca = dir_ + "/live-ca.crt";
  std::ofstream(ca) << ReadAll(dir_ + "/ca.crt");
  NodeCredentialsOptions o;
  o.tls = TlsFiles{dir_ + "/node.crt", dir_ + "/node.key", ca};
  auto creds = NodeCredentials::Load(o);
  ASSERT_TRUE(creds.ok()) << creds.status();
  Start(*creds);
  grpc::SslCredentialsOptions foreign;
  foreign.pem_root_certs = ReadAll(dir_ + "/ca.crt");
  foreign.pem_cert_chain = ReadAll(dir_ + "/stranger.crt");
  foreign.pem_private_key = ReadAll(dir_ + "/stranger.key");
  auto before = RawStub(server_->address(), grpc::SslCredentials(foreign));
  EXPECT_EQ(RawGet(*before).error_code(), grpc::StatusCode::UNAVAILABLE);
  // The operator adds the other CA and sends SIGHUP.
  std::ofstream(ca) << ReadAll(dir_ + "/ca.crt")
                    << ReadAll(dir_ + "/other-ca.crt");
  ASSERT_TRUE(server_creds_->Reload().ok());
  auto after = RawStub(server_->address(), grpc::SslCredentials(foreign));
  // Through the handshake now: the key is just not there yet.
  EXPECT_EQ(RawGet(*after).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

// Point 3: with rendezvous.expected_node_ids, an authenticated daemon that
// is not on the list is refused before it takes a slot; the listed nodes
// form as if it had never come.
TEST_F(RendezvousAuthTest, AnUnexpectedNodeIsRefusedBeforeTakingASlot) {
  Start(Load("token"), {"node-a", "node-b"});
  auto node = [&](const std::string& id) {
    JobFormationOptions o;
    o.job_id = "job";
    o.node_id = id;
    o.num_nodes = 2;
    o.local_world_size = 1;
    o.params = {Param("fc.weight")};
    o.timeout = absl::Seconds(10);
    o.prefix = "round1/members";
    return o;
  };
  auto evil = Client(Load("token"));
  JobFormationOptions as_rank_0 = node("node-evil");
  as_rank_0.node_rank = 0;
  const absl::Status refused = FormJob(*evil, as_rank_0).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(
      Message(refused),
      AllOf(HasSubstr("node 'node-evil'"),
            HasSubstr("rendezvous.expected_node_ids (node-a, node-b)")));
  // Nor can it write a slot naming itself.
  EXPECT_EQ(evil->Set("job", "round1/members/slot/0", "node-evil").code(),
            absl::StatusCode::kPermissionDenied);
  std::vector<absl::StatusOr<JobLayout>> layouts(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto client = Client(Load("token"));
      layouts[i] = FormJob(*client, node(i == 0 ? "node-b" : "node-a"));
    });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& layout : layouts) {
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(layout->NodeIds(),
              (std::vector<std::string>{"node-a", "node-b"}));
  }
}

}  // namespace
}  // namespace gradd
