// The Gloo pair membership proof (server/auth/pair_handshake.h) as pure
// state machines: the right key passes both ways; a wrong key, a replayed
// proof, a reflected proof, the wrong pair or a stranger's bytes fail.
#include "server/auth/pair_handshake.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

std::string Key(char fill) { return std::string(kPairKeyBytes, fill); }

PairHandshakeClient Client(const std::string& key, uint32_t me, uint32_t peer) {
  absl::StatusOr<PairHandshakeClient> c =
      PairHandshakeClient::Create(key, me, peer);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

PairHandshakeServer Server(const std::string& key, uint32_t me, uint32_t peer) {
  absl::StatusOr<PairHandshakeServer> s =
      PairHandshakeServer::Create(key, me, peer);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

TEST(PairHandshakeTest, RightKeyPassesBothWays) {
  PairHandshakeClient client = Client(Key('k'), 1, 0);
  PairHandshakeServer server = Server(Key('k'), 0, 1);
  ASSERT_EQ(client.hello().size(), kPairHelloBytes);
  absl::StatusOr<std::string> reply = server.OnHello(client.hello());
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->size(), kPairReplyBytes);
  absl::StatusOr<std::string> finish = client.OnReply(*reply);
  ASSERT_TRUE(finish.ok()) << finish.status();
  ASSERT_EQ(finish->size(), kPairFinishBytes);
  absl::StatusOr<std::string> ack = server.OnFinish(*finish);
  ASSERT_TRUE(ack.ok()) << ack.status();
  ASSERT_EQ(ack->size(), kPairAckBytes);
  EXPECT_TRUE(client.OnAck(*ack).ok());
}

TEST(PairHandshakeTest, ClientRefusesAServerWithAnotherKey) {
  PairHandshakeClient client = Client(Key('k'), 1, 0);
  PairHandshakeServer server = Server(Key('x'), 0, 1);
  absl::StatusOr<std::string> reply = server.OnHello(client.hello());
  ASSERT_TRUE(reply.ok());
  absl::StatusOr<std::string> finish = client.OnReply(*reply);
  EXPECT_EQ(finish.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(finish.status().message(), HasSubstr("does not verify"));
}

TEST(PairHandshakeTest, ServerRefusesAClientWithAnotherKey) {
  // A client that cannot check the server's proof (another key) and answers
  // anyway with its own key's proof.
  PairHandshakeServer server = Server(Key('k'), 0, 1);
  PairHandshakeClient client = Client(Key('x'), 1, 0);
  absl::StatusOr<std::string> reply = server.OnHello(client.hello());
  ASSERT_TRUE(reply.ok());
  const std::string nonce_c = client.hello().substr(16);
  const std::string nonce_s = reply->substr(0, kPairNonceBytes);
  const std::string forged = PairProof(Key('x'), 'C', 1, 0, nonce_c, nonce_s);
  absl::StatusOr<std::string> ack = server.OnFinish(forged);
  EXPECT_EQ(ack.status().code(), absl::StatusCode::kUnauthenticated);
  // And the same proof with the right key passes (the forged one failed for
  // its key, not its shape).
  PairHandshakeServer again = Server(Key('k'), 0, 1);
  PairHandshakeClient honest = Client(Key('k'), 1, 0);
  reply = again.OnHello(honest.hello());
  ASSERT_TRUE(reply.ok());
  EXPECT_TRUE(
      again
          .OnFinish(PairProof(Key('k'), 'C', 1, 0, honest.hello().substr(16),
                              reply->substr(0, kPairNonceBytes)))
          .ok());
}

TEST(PairHandshakeTest, ReplayedClientProofFails) {
  // Record a whole successful exchange...
  PairHandshakeClient client = Client(Key('k'), 1, 0);
  PairHandshakeServer server = Server(Key('k'), 0, 1);
  absl::StatusOr<std::string> reply = server.OnHello(client.hello());
  ASSERT_TRUE(reply.ok());
  absl::StatusOr<std::string> finish = client.OnReply(*reply);
  ASSERT_TRUE(finish.ok());
  ASSERT_TRUE(server.OnFinish(*finish).ok());
  // ...and replay the client's messages to a new listener: its nonce is
  // fresh, so the recorded proof no longer verifies.
  PairHandshakeServer next = Server(Key('k'), 0, 1);
  ASSERT_TRUE(next.OnHello(client.hello()).ok());
  absl::StatusOr<std::string> ack = next.OnFinish(*finish);
  EXPECT_EQ(ack.status().code(), absl::StatusCode::kUnauthenticated);
}

TEST(PairHandshakeTest, ReplayedServerReplyFails) {
  PairHandshakeClient first = Client(Key('k'), 1, 0);
  PairHandshakeServer server = Server(Key('k'), 0, 1);
  absl::StatusOr<std::string> reply = server.OnHello(first.hello());
  ASSERT_TRUE(reply.ok());
  PairHandshakeClient second = Client(Key('k'), 1, 0);
  EXPECT_EQ(second.OnReply(*reply).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(PairHandshakeTest, ServerProofCannotBeReflectedAsClientProof) {
  PairHandshakeServer server = Server(Key('k'), 0, 1);
  PairHandshakeClient client = Client(Key('k'), 1, 0);
  absl::StatusOr<std::string> reply = server.OnHello(client.hello());
  ASSERT_TRUE(reply.ok());
  // The server's own proof sent back as the client's.
  EXPECT_EQ(server.OnFinish(reply->substr(kPairNonceBytes)).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(PairHandshakeTest, HelloForAnotherPairIsRefused) {
  PairHandshakeServer server = Server(Key('k'), 0, 1);
  PairHandshakeClient from_two = Client(Key('k'), 2, 0);
  absl::StatusOr<std::string> reply = server.OnHello(from_two.hello());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(reply.status().message(), HasSubstr("ranks 2 -> 0"));
  PairHandshakeServer other = Server(Key('k'), 3, 1);
  PairHandshakeClient to_zero = Client(Key('k'), 1, 0);
  EXPECT_FALSE(other.OnHello(to_zero.hello()).ok());
}

TEST(PairHandshakeTest, ProofBindsBothRanks) {
  const std::string nc(kPairNonceBytes, 'c');
  const std::string ns(kPairNonceBytes, 's');
  const std::string proof = PairProof(Key('k'), 'C', 1, 0, nc, ns);
  EXPECT_NE(proof, PairProof(Key('k'), 'C', 2, 0, nc, ns));
  EXPECT_NE(proof, PairProof(Key('k'), 'C', 1, 2, nc, ns));
  EXPECT_NE(proof, PairProof(Key('k'), 'S', 1, 0, nc, ns));
  EXPECT_NE(proof, PairProof(Key('k'), 'C', 1, 0, ns, nc));
  EXPECT_EQ(proof, PairProof(Key('k'), 'C', 1, 0, nc, ns));
  EXPECT_EQ(proof.size(), kPairMacBytes);
}

TEST(PairHandshakeTest, StrangerBytesAreNotAHello) {
  PairHandshakeServer server = Server(Key('k'), 0, 1);
  // A Gloo preamble (six size_t) where the hello should be.
  std::string gloo(kPairHelloBytes, '\0');
  gloo[0] = 48;
  gloo[8] = 2;
  EXPECT_EQ(server.OnHello(gloo).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(CouldBePairHello(gloo));
  EXPECT_FALSE(CouldBePairHello("GET / HTTP/1.1"));
  EXPECT_TRUE(CouldBePairHello(""));
  EXPECT_TRUE(CouldBePairHello("gradd"));
  PairHandshakeClient client = Client(Key('k'), 1, 0);
  EXPECT_TRUE(CouldBePairHello(client.hello()));
  // A truncated hello is refused too.
  EXPECT_FALSE(server.OnHello(client.hello().substr(0, 20)).ok());
}

TEST(PairHandshakeTest, StepsOutOfOrderAreRefused) {
  PairHandshakeServer server = Server(Key('k'), 0, 1);
  EXPECT_EQ(server.OnFinish(std::string(kPairFinishBytes, 'x')).status().code(),
            absl::StatusCode::kFailedPrecondition);
  PairHandshakeClient client = Client(Key('k'), 1, 0);
  EXPECT_EQ(client.OnAck("gradd-ok").code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(server.OnHello(client.hello()).ok());
  EXPECT_EQ(server.OnHello(client.hello()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(PairHandshakeTest, KeysAreCheckedAndFresh) {
  EXPECT_EQ(PairHandshakeClient::Create("short", 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      PairHandshakeServer::Create(std::string(33, 'k'), 0, 1).status().code(),
      absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::string> a = RandomPairKey();
  absl::StatusOr<std::string> b = RandomPairKey();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), kPairKeyBytes);
  EXPECT_NE(*a, *b);
  // Every hello carries a fresh nonce.
  EXPECT_NE(Client(*a, 1, 0).hello(), Client(*a, 1, 0).hello());
}

}  // namespace
}  // namespace gradd
