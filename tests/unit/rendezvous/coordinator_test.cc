// Coordinator discovery (server/rendezvous/coordinator.h) and the address
// helpers it relies on (host_addresses.h): the daemon on the host the
// trainers name serves the store on demand, the others only connect, two
// daemons on one machine never split a store, and configured addresses win.
#include "server/rendezvous/coordinator.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rendezvous/host_addresses.h"
#include "server/rendezvous/rendezvous_client.h"
#include "tests/support/temp_dir.h"
#include "tests/unit/auth/test_certs.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A port nobody listens on right now (bound, read, released).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(a.sin_port);
}

// Discovery itself, on a daemon allowed to run without credentials
// (rendezvous.insecure); the credentials' own tests are further down.
CoordinatorSelector::Options OnDemand(int port) {
  CoordinatorSelector::Options o;
  o.port = port;
  o.bind_host = "127.0.0.1";
  o.insecure = true;
  return o;
}

// Set through one address, read back through another client: the store
// behind `address` is one store.
void ExpectOneStore(const std::string& address) {
  RendezvousClient::Options o;
  o.address = address;
  o.connect_timeout = absl::Seconds(10);
  auto writer = RendezvousClient::Create(o);
  auto reader = RendezvousClient::Create(o);
  ASSERT_TRUE(writer.ok() && reader.ok());
  ASSERT_TRUE((*writer)->Set("job", "k", "v").ok());
  absl::StatusOr<std::string> got =
      (*reader)->Get("job", "k", absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
}

TEST(CoordinatorTest, LocalHostWithoutPortIsServedOnDemandAtTheDefaultPort) {
  const int port = FreePort();
  ASSERT_GT(port, 0);
  auto s = CoordinatorSelector::Create(OnDemand(port));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->serving_port(), 0);  // nothing until a job asks
  EXPECT_EQ((*s)->serving_address(), "");
  absl::StatusOr<std::string> address = (*s)->Resolve("127.0.0.1");
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(*address, absl::StrCat("127.0.0.1:", port));
  EXPECT_EQ((*s)->serving_port(), port);
  ExpectOneStore(*address);
  // Later jobs reuse the running server.
  EXPECT_EQ(*(*s)->Resolve("localhost"), absl::StrCat("localhost:", port));
  EXPECT_EQ((*s)->serving_port(), port);
}

TEST(CoordinatorTest, ARemoteHostIsOnlyConnectedTo) {
  CoordinatorSelector::Options o = OnDemand(FreePort());
  o.is_local = [](const std::string&) { return false; };
  auto s = CoordinatorSelector::Create(o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*(*s)->Resolve("node-a"), absl::StrCat("node-a:", o.port));
  EXPECT_EQ(*(*s)->Resolve("[fd00::1]:7000"), "[fd00::1]:7000");
  EXPECT_EQ((*s)->serving_port(), 0);
}

TEST(CoordinatorTest, AnExplicitOtherPortIsNotServedHere) {
  CoordinatorSelector::Options o = OnDemand(FreePort());
  auto s = CoordinatorSelector::Create(o);
  ASSERT_TRUE(s.ok());
  const int other = o.port == 65535 ? 65534 : o.port + 1;
  EXPECT_EQ(*(*s)->Resolve(absl::StrCat("127.0.0.1:", other)),
            absl::StrCat("127.0.0.1:", other));
  EXPECT_EQ((*s)->serving_port(), 0);
}

TEST(CoordinatorTest, TwoDaemonsOnOneMachineShareTheFirstOnesStore) {
  const int port = FreePort();
  auto first = CoordinatorSelector::Create(OnDemand(port));
  auto second = CoordinatorSelector::Create(OnDemand(port));
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE((*first)->Resolve("127.0.0.1").ok());
  // The port is taken (no SO_REUSEPORT): the second connects instead.
  absl::StatusOr<std::string> address = (*second)->Resolve("127.0.0.1");
  ASSERT_TRUE(address.ok());
  EXPECT_EQ((*first)->serving_port(), port);
  EXPECT_EQ((*second)->serving_port(), 0);
  ExpectOneStore(*address);
}

TEST(CoordinatorTest, ConfiguredAddressesWin) {
  CoordinatorSelector::Options o = OnDemand(FreePort());
  o.coordinator_address = "coord:1234";
  auto s = CoordinatorSelector::Create(o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*(*s)->Resolve("127.0.0.1"), "coord:1234");
  EXPECT_EQ((*s)->serving_port(), 0);

  CoordinatorSelector::Options l = OnDemand(FreePort());
  l.listen_address = "127.0.0.1:0";
  auto served = CoordinatorSelector::Create(l);
  ASSERT_TRUE(served.ok()) << served.status();
  const int port = (*served)->serving_port();
  ASSERT_GT(port, 0);
  EXPECT_EQ((*served)->serving_address(), absl::StrCat("127.0.0.1:", port));
  EXPECT_EQ(*(*served)->Resolve("elsewhere"), absl::StrCat("127.0.0.1:", port));
}

TEST(CoordinatorTest, NoCoordinatorOrAMalformedOneIsAClearError) {
  auto s = CoordinatorSelector::Create(OnDemand(FreePort()));
  ASSERT_TRUE(s.ok());
  absl::StatusOr<std::string> none = (*s)->Resolve("");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("MASTER_ADDR"));
  absl::StatusOr<std::string> bad = (*s)->Resolve("host:99999");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("99999"));
}

// Issue 20: a daemon without credentials (and without rendezvous.insecure)
// takes part in no multi-node job: it neither opens the rendezvous port nor
// calls another daemon, and says which keys to set.
TEST(CoordinatorTest, WithoutCredentialsMultiNodeIsRefusedBeforeAnyPort) {
  CoordinatorSelector::Options o = OnDemand(FreePort());
  o.insecure = false;
  auto s = CoordinatorSelector::Create(o);
  ASSERT_TRUE(s.ok());
  for (const absl::Status& refused :
       {(*s)->Resolve("127.0.0.1").status(),
        (*s)->Connect("127.0.0.1:1", absl::Seconds(1)).status()}) {
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(
        std::string(refused.message()),
        AllOf(HasSubstr("rendezvous.token_file"), HasSubstr("rendezvous.tls"),
              HasSubstr("rendezvous.insecure: true")));
  }
  EXPECT_EQ((*s)->serving_port(), 0);
  EXPECT_THAT((*s)->SecurityDescription(),
              HasSubstr("multi-node jobs refused"));
  CoordinatorSelector::Options listen = o;
  listen.listen_address = "127.0.0.1:0";
  absl::Status served = CoordinatorSelector::Create(listen).status();
  EXPECT_EQ(served.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(served.message()),
              HasSubstr("rendezvous.listen_address"));
  o.insecure = true;
  auto insecure = CoordinatorSelector::Create(o);
  ASSERT_TRUE(insecure.ok());
  EXPECT_THAT((*insecure)->SecurityDescription(), HasSubstr("INSECURE"));
}

// With a token, the store the selector serves demands it and the clients
// Connect() makes carry it; the store's limits come from the options.
TEST(CoordinatorTest, TheServedStoreDemandsTheDaemonsCredentials) {
  testing::TempDir dir("gradd-coord-");
  ASSERT_FALSE(dir.path().empty());
  const std::string token = dir.path() + "/token";
  ASSERT_TRUE(testing::WriteSecret(token, "0123456789abcdef0123456789abcdef"));
  NodeCredentialsOptions creds;
  creds.token_file = token;
  auto loaded = NodeCredentials::Load(creds);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  CoordinatorSelector::Options o = OnDemand(FreePort());
  o.insecure = false;
  o.credentials = *loaded;
  o.store.max_value_bytes = 1000;
  auto s = CoordinatorSelector::Create(o);
  ASSERT_TRUE(s.ok());
  absl::StatusOr<std::string> address = (*s)->Resolve("127.0.0.1");
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ((*s)->serving_port(), o.port);
  EXPECT_EQ((*s)->SecurityDescription(), "token (calls not encrypted)");
  auto member = (*s)->Connect(*address, absl::Seconds(10));
  ASSERT_TRUE(member.ok()) << member.status();
  EXPECT_TRUE((*member)->Set("job", "k", "v").ok());
  EXPECT_THAT(
      std::string((*member)->Set("job", "k", std::string(1001, 'x')).message()),
      HasSubstr("rendezvous.limits.max_value_bytes = 1000"));
  RendezvousClient::Options plain;
  plain.address = *address;
  auto stranger = RendezvousClient::Create(plain);
  ASSERT_TRUE(stranger.ok());
  EXPECT_EQ((*stranger)->Set("job", "k", "poisoned").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(*(*member)->Get("job", "k", absl::Seconds(1)), "v");
}

TEST(HostAddressesTest, ParsesHostsAndPorts) {
  EXPECT_EQ(ParseHostPort("a")->host, "a");
  EXPECT_FALSE(ParseHostPort("a")->port.has_value());
  EXPECT_EQ(*ParseHostPort("a:5")->port, 5);
  EXPECT_EQ(ParseHostPort("[::1]:7")->host, "::1");
  EXPECT_EQ(*ParseHostPort("[::1]:7")->port, 7);
  EXPECT_EQ(ParseHostPort("fd00::2")->host, "fd00::2");
  EXPECT_FALSE(ParseHostPort(":5").ok());
  EXPECT_FALSE(ParseHostPort("a:0").ok());
  EXPECT_EQ(JoinHostPort("::1", 3), "[::1]:3");
  EXPECT_EQ(JoinHostPort("h", 3), "h:3");
}

TEST(HostAddressesTest, LoopbackIsLocalAndReservedAddressesAreNot) {
  EXPECT_TRUE(IsLocalHost("127.0.0.1"));
  EXPECT_TRUE(IsLocalHost("localhost"));
  // TEST-NET-1 (RFC 5737): never assigned to a real interface.
  EXPECT_FALSE(IsLocalHost("192.0.2.1"));
  EXPECT_FALSE(IsLocalHost("no-such-host.invalid"));
}

TEST(HostAddressesTest, InterfacesAndRoutes) {
  absl::StatusOr<std::string> lo = InterfaceAddress("lo");
  ASSERT_TRUE(lo.ok()) << lo.status();
  EXPECT_EQ(*lo, "127.0.0.1");
  absl::StatusOr<std::string> none = InterfaceAddress("nosuchif0");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("lo"));  // lists them
  EXPECT_EQ(*RouteSourceAddress("127.0.0.1"), "127.0.0.1");
  // The advertised address: configured host, then interface, then route.
  EXPECT_EQ(*AdvertiseAddress("h", "lo", "127.0.0.1:1"), "h");
  EXPECT_EQ(*AdvertiseAddress("", "lo", "192.0.2.1:1"), "127.0.0.1");
  EXPECT_EQ(*AdvertiseAddress("", "", "127.0.0.1:1"), "127.0.0.1");
  EXPECT_FALSE(AdvertiseAddress("", "nosuchif0", "127.0.0.1:1").ok());
}

}  // namespace
}  // namespace gradd
