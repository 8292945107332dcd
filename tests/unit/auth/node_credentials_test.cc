// Loading and checking the daemon credentials (server/auth/): TLS files
// checked before gRPC sees them, the token file, what a config without them
// means, Describe never showing a secret, and Reload keeping the old
// material when the new one is bad. The credentials on the wire (handshakes,
// tokens in calls) are tested through the rendezvous service in
// tests/unit/rendezvous/rendezvous_auth_test.cc.
#include "server/auth/node_credentials.h"

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/auth/tls_material.h"
#include "tests/unit/auth/test_certs.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

std::string Message(const absl::Status& s) { return std::string(s.message()); }

class NodeCredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTestCerts();
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { testing::RemoveTree(dir_); }
  TlsFiles Files(const std::string& name, const std::string& ca = "ca") const {
    return TlsFiles{dir_ + "/" + name + ".crt", dir_ + "/" + name + ".key",
                    dir_ + "/" + ca + ".crt"};
  }
  std::string dir_;
};

TEST_F(NodeCredentialsTest, GoodFilesLoadAndNameTheCertificate) {
  absl::StatusOr<TlsMaterial> m = LoadTlsMaterial(Files("node"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->subject, HasSubstr("CN=node"));
  EXPECT_GT(m->not_after, absl::Now());
  EXPECT_LT(m->not_after, absl::Now() + absl::Hours(72));
}

TEST_F(NodeCredentialsTest, WrongFilesAreRefusedNamingKeyAndReason) {
  TlsFiles mismatched = Files("node");
  mismatched.key_file = dir_ + "/node2.key";
  EXPECT_THAT(Message(LoadTlsMaterial(mismatched).status()),
              AllOf(HasSubstr("rendezvous.tls.key_file"),
                    HasSubstr("is not the private key of the certificate")));

  EXPECT_THAT(Message(LoadTlsMaterial(Files("stranger")).status()),
              AllOf(HasSubstr("does not verify against rendezvous.tls.ca_file"),
                    HasSubstr("CN=stranger")));

  EXPECT_THAT(Message(LoadTlsMaterial(Files("server-only")).status()),
              AllOf(HasSubstr("may not be used as a TLS client"),
                    HasSubstr("clientAuth")));

  TlsFiles swapped = Files("node");
  swapped.cert_file = dir_ + "/node.key";  // a key where a certificate goes
  const absl::Status s = LoadTlsMaterial(swapped).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), AllOf(HasSubstr("rendezvous.tls.cert_file"),
                                HasSubstr("holds no PEM certificate")));

  TlsFiles missing = Files("node");
  missing.ca_file = dir_ + "/none.crt";
  EXPECT_EQ(LoadTlsMaterial(missing).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(NodeCredentialsTest, LoadNeedsATokenOrAllThreeTlsFiles) {
  EXPECT_THAT(Message(NodeCredentials::Load({}).status()),
              HasSubstr("no daemon credentials configured"));
  NodeCredentialsOptions partial;
  partial.tls.cert_file = dir_ + "/node.crt";
  EXPECT_THAT(Message(NodeCredentials::Load(partial).status()),
              AllOf(HasSubstr("rendezvous.tls.key_file"),
                    HasSubstr("rendezvous.tls.ca_file")));
  NodeCredentialsOptions name_only;
  name_only.token_file = dir_ + "/token";
  name_only.tls_server_name = "gradd";
  ASSERT_TRUE(testing::WriteSecret(dir_ + "/token", kToken));
  EXPECT_THAT(Message(NodeCredentials::Load(name_only).status()),
              HasSubstr("rendezvous.tls.server_name is set"));
}

TEST_F(NodeCredentialsTest, DescribeSaysWhatIsUsedAndNeverTheToken) {
  ASSERT_TRUE(testing::WriteSecret(dir_ + "/token", kToken));
  NodeCredentialsOptions token_only;
  token_only.token_file = dir_ + "/token";
  auto t = NodeCredentials::Load(token_only);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE((*t)->uses_token());
  EXPECT_FALSE((*t)->uses_tls());
  EXPECT_EQ((*t)->Describe(), "token (calls not encrypted)");

  NodeCredentialsOptions both = token_only;
  both.tls = Files("node");
  auto b = NodeCredentials::Load(both);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT((*b)->Describe(),
              AllOf(HasSubstr("mutual TLS"), HasSubstr("CN=node"),
                    HasSubstr("+ token"), Not(HasSubstr(kToken))));
}

TEST_F(NodeCredentialsTest, ReloadTakesNewFilesAndKeepsTheOldOnError) {
  const std::string cert = dir_ + "/live.crt";
  const std::string key = dir_ + "/live.key";
  auto copy = [](const std::string& from, const std::string& to) {
    std::ifstream in(from);
    std::ofstream(to) << in.rdbuf();
  };
  copy(dir_ + "/node.crt", cert);
  copy(dir_ + "/node.key", key);
  NodeCredentialsOptions o;
  o.tls = TlsFiles{cert, key, dir_ + "/ca.crt"};
  auto creds = NodeCredentials::Load(o);
  ASSERT_TRUE(creds.ok()) << creds.status();
  EXPECT_THAT((*creds)->Describe(), HasSubstr("CN=node,"));

  // Half-replaced files (new certificate, old key) are refused as a whole.
  copy(dir_ + "/node2.crt", cert);
  EXPECT_THAT(Message((*creds)->Reload()),
              HasSubstr("is not the private key of the certificate"));
  EXPECT_THAT((*creds)->Describe(), HasSubstr("CN=node,"));

  copy(dir_ + "/node2.key", key);
  ASSERT_TRUE((*creds)->Reload().ok());
  EXPECT_THAT((*creds)->Describe(), HasSubstr("CN=node2"));
}

TEST(NodeCredentialsConfigTest, OptionsComeFromTheRendezvousSection) {
  v1::RendezvousConfig rv;
  EXPECT_FALSE(HasNodeCredentials(rv));
  rv.mutable_tls()->set_ca_file("/ca");
  EXPECT_TRUE(HasNodeCredentials(rv));
  rv.set_token_file("/t");
  rv.mutable_tls()->set_server_name("gradd");
  const NodeCredentialsOptions o = NodeCredentialsOptionsOf(rv);
  EXPECT_EQ(o.token_file, "/t");
  EXPECT_EQ(o.tls.ca_file, "/ca");
  EXPECT_EQ(o.tls_server_name, "gradd");
}

}  // namespace
}  // namespace gradd
