// Authenticated Gloo pairs (server/backends/gloo/authenticated_tcp.h): a
// stranger who races the real peer to a pair's port is refused and the mesh
// still forms and reduces exactly; a peer with another key is refused and
// named. The stranger wins the race deterministically: a store wrapper
// connects it to every address a node publishes before the real peer can
// read that address. (Gloo's own TCP transport appears only as the
// baseline the attack is shown on.)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/transport/tcp/address.h"
#include "gloo/transport/tcp/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/auth/pair_handshake.h"
#include "server/backends/gloo/authenticated_tcp.h"
#include "server/backends/gloo/gloo_backend.h"
#include "server/rendezvous/fake_store.h"
#include "server/rendezvous/rendezvous_client.h"
#include "server/rendezvous/rendezvous_service.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

// What the stranger sends once connected.
enum class Stranger {
  kSilent,           // connects and holds the connection
  kGarbage,          // text that is no protocol at all
  kGlooNotify,       // a plausible Gloo preamble: "I have a send for you"
  kGlooUnboundSend,  // unsolicited Gloo payload: aborts a stock Gloo reader
  kWrongKey,         // gradd's handshake with a key of its own
};

std::string Name(Stranger s) {
  switch (s) {
    case Stranger::kSilent:
      return "Silent";
    case Stranger::kGarbage:
      return "Garbage";
    case Stranger::kGlooNotify:
      return "GlooNotify";
    case Stranger::kGlooUnboundSend:
      return "GlooUnboundSend";
    case Stranger::kWrongKey:
      return "WrongKey";
  }
  return "?";
}

// A Gloo TCP preamble: six size_t (nbytes, opcode, slot, offset, length,
// roffset), then `payload` bytes.
std::string GlooOp(size_t opcode, size_t payload) {
  size_t preamble[6] = {48 + payload, opcode, 0, 0, payload, 0};
  std::string out(reinterpret_cast<const char*>(preamble), sizeof(preamble));
  out.append(payload, 'x');
  return out;
}

// Connects strangers to published pair addresses; closes them at the end.
class Strangers {
 public:
  explicit Strangers(Stranger kind) : kind_(kind) {}
  ~Strangers() {
    for (int fd : fds_) ::close(fd);
  }

  // `all`: what node `rank` of `n` published (one address per peer, in
  // peer order). Connects to each (the kernel completes the connection
  // before the pair's owner accepts it) and sends the stranger's bytes.
  void Attack(const std::vector<char>& all, int rank, int n) {
    const size_t per = all.size() / (n - 1);
    for (int i = 0; i < n - 1; ++i) {
      const int peer = i < rank ? i : i + 1;
      std::vector<char> bytes(all.begin() + i * per,
                              all.begin() + (i + 1) * per);
      // gradd's transport's address, else Gloo's (the stock baseline).
      sockaddr_storage ss{};
      if (absl::StatusOr<PairAddress> ours = PairAddress::Parse(bytes);
          ours.ok()) {
        ss = ours->sockaddr();
      } else {
        ss = gloo::transport::tcp::Address(bytes).getSockaddr();
      }
      const int fd = ::socket(ss.ss_family, SOCK_STREAM, 0);
      ASSERT_GE(fd, 0);
      const socklen_t len =
          ss.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      ASSERT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&ss), len), 0)
          << std::strerror(errno);
      std::string bytes_out;
      switch (kind_) {
        case Stranger::kSilent:
          break;
        case Stranger::kGarbage:
          bytes_out = "GET / HTTP/1.1\r\nHost: gloo\r\n\r\n";
          break;
        case Stranger::kGlooNotify:
          bytes_out = GlooOp(2, 0);
          break;
        case Stranger::kGlooUnboundSend:
          bytes_out = GlooOp(1, 64);
          break;
        case Stranger::kWrongKey: {
          // The hello the real peer would send, then a proof made with a
          // key of its own (it cannot check the listener's, nor make the
          // right one).
          absl::StatusOr<PairHandshakeClient> c = PairHandshakeClient::Create(
              std::string(kPairKeyBytes, 's'), peer, rank);
          ASSERT_TRUE(c.ok());
          bytes_out = c->hello() + std::string(kPairFinishBytes, 'p');
          break;
        }
      }
      if (!bytes_out.empty()) {
        ASSERT_EQ(::send(fd, bytes_out.data(), bytes_out.size(), MSG_NOSIGNAL),
                  static_cast<ssize_t>(bytes_out.size()));
      }
      std::lock_guard<std::mutex> lock(mu_);
      fds_.push_back(fd);
      ++connections_;
    }
  }

  int connections() {
    std::lock_guard<std::mutex> lock(mu_);
    return connections_;
  }

 private:
  const Stranger kind_;
  std::mutex mu_;
  std::vector<int> fds_;
  int connections_ = 0;
};

// Gloo's store for the transport-level tests: when a node publishes its
// pair addresses (key "<rank>"), the strangers connect to them first.
class RacingGlooStore : public gloo::rendezvous::Store {
 public:
  RacingGlooStore(Strangers* strangers, int n) : strangers_(strangers), n_(n) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    int rank = 0;
    if (strangers_ != nullptr && absl::SimpleAtoi(key, &rank)) {
      strangers_->Attack(data, rank, n_);
    }
    inner_.set(key, data);
  }
  std::vector<char> get(const std::string& key) override {
    return inner_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override {
    inner_.wait(keys);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    inner_.wait(keys, timeout);
  }

 private:
  Strangers* const strangers_;
  const int n_;
  gloo::rendezvous::HashStore inner_;
};

struct Formed {
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::string error;  // what connectFullMesh threw, if it did
};

// Forms an n-node mesh (threads) on loopback; `device(rank)` makes each
// node's device.
std::vector<Formed> FormMesh(
    int n, gloo::rendezvous::Store& store,
    const std::function<std::shared_ptr<gloo::transport::Device>(int)>& device,
    std::chrono::milliseconds timeout) {
  std::vector<Formed> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto context = std::make_shared<gloo::rendezvous::Context>(r, n);
        context->setTimeout(timeout);
        std::shared_ptr<gloo::transport::Device> dev = device(r);
        context->connectFullMesh(store, dev);
        out[r].context = std::move(context);
      } catch (const std::exception& e) {
        out[r].error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

void SumFloats(void* c, const void* a, const void* b, size_t n) {
  gloo::sum<float>(c, a, b, n);
}

// Allreduces rank-dependent values; "" when every node got the exact sum.
std::string CheckAllreduce(std::vector<Formed>& mesh) {
  const int n = static_cast<int>(mesh.size());
  constexpr size_t kCount = 4099;
  std::vector<std::vector<float>> data(n, std::vector<float>(kCount));
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < kCount; ++i) data[r][i] = (r + 1) * (i % 97);
    threads.emplace_back([&, r] {
      try {
        gloo::AllreduceOptions opts(mesh[r].context);
        opts.setOutput(data[r].data(), kCount);
        opts.setReduceFunction(&SumFloats);
        opts.setTimeout(std::chrono::seconds(3));
        gloo::allreduce(opts);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!errors[r].empty()) return absl::StrCat("node ", r, ": ", errors[r]);
    for (size_t i = 0; i < kCount; ++i) {
      const float want = n * (n + 1) / 2 * static_cast<float>(i % 97);
      if (data[r][i] != want) {
        return absl::StrCat("node ", r, " element ", i, ": ", data[r][i],
                            " != ", want);
      }
    }
  }
  return "";
}

std::shared_ptr<gloo::transport::Device> Authenticated(
    const std::string& key, std::shared_ptr<PairAuthCounters> counters) {
  PairAuthOptions options;
  options.key = key;
  options.job_id = "job";
  options.node_names = {"host-0", "host-1", "host-2"};
  return CreateAuthenticatedTcpDevice("127.0.0.1", options, std::move(counters))
      .value();
}

std::shared_ptr<gloo::transport::Device> Stock() {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  return gloo::transport::tcp::CreateDevice(attr);
}

const std::string kKey(kPairKeyBytes, 'k');

// The attack is real: with Gloo's own pairs the stranger who races the
// real peer becomes the pair's peer, and the mesh cannot reduce. (This is
// what the tests below would see without the membership proof; it keeps
// the race in them honest.)
TEST(GlooPairAuthTest, StrangerRacingStockGlooPairsBreaksTheMesh) {
  Strangers strangers(Stranger::kGlooNotify);
  RacingGlooStore store(&strangers, 2);
  std::vector<Formed> mesh = FormMesh(
      2, store, [](int) { return Stock(); }, std::chrono::seconds(3));
  if (strangers.connections() == 0) {
    // Debian 13's Gloo (0.0~git20231202) connects its TCP pairs through
    // one device-wide listener and its own store keys: the race below is
    // Debian 12's Gloo's. gradd's transport is raced the same way on both.
    GTEST_SKIP() << "this Gloo's TCP transport did not publish per-pair "
                    "addresses under the rank keys";
  }
  EXPECT_GE(strangers.connections(), 2);
  bool formed = true;
  for (const Formed& f : mesh) formed = formed && f.context != nullptr;
  if (formed) {
    EXPECT_NE(CheckAllreduce(mesh), "")
        << "the stranger did not get into any pair";
  }
}

class StrangerRaceTest : public ::testing::TestWithParam<Stranger> {};

TEST_P(StrangerRaceTest, StrangerIsRefusedAndTheMeshStillFormsExactly) {
  for (int n : {2, 3}) {
    Strangers strangers(GetParam());
    RacingGlooStore store(&strangers, n);
    auto counters = std::make_shared<PairAuthCounters>();
    std::vector<Formed> mesh = FormMesh(
        n, store, [&](int) { return Authenticated(kKey, counters); },
        std::chrono::seconds(10));
    for (int r = 0; r < n; ++r) {
      ASSERT_NE(mesh[r].context, nullptr)
          << n << " nodes, node " << r << ": " << mesh[r].error;
    }
    // Every node published n-1 addresses and the stranger raced each.
    EXPECT_EQ(strangers.connections(), n * (n - 1));
    EXPECT_EQ(counters->authenticated.load(),
              static_cast<uint64_t>(n * (n - 1)));
    // Every stranger's connection gets a verdict: refused by the port it
    // raced to while that port waits for its real peer, or, once every
    // pair is in (the last node's port closes as soon as its own
    // connections are made; a silent stranger never completes anything),
    // refused as late when the port closes. None is dropped unseen.
    // (The last verdicts come from each port's own thread as it closes,
    // just after the mesh formed.)
    const uint64_t attacks = strangers.connections();
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (counters->refused.load() < attacks && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(counters->refused.load(), attacks) << n << " nodes";
    EXPECT_EQ(CheckAllreduce(mesh), "") << n << " nodes";
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, StrangerRaceTest,
                         ::testing::Values(Stranger::kSilent,
                                           Stranger::kGarbage,
                                           Stranger::kGlooNotify,
                                           Stranger::kGlooUnboundSend,
                                           Stranger::kWrongKey),
                         [](const ::testing::TestParamInfo<Stranger>& info) {
                           return Name(info.param);
                         });

TEST(GlooPairAuthTest, FloodOfSilentStrangersDoesNotKeepThePeerOut) {
  // More silent strangers than a pair keeps pending: the oldest are dropped
  // and the real peer, arriving last, still gets in.
  class FloodStore : public RacingGlooStore {
   public:
    FloodStore(Strangers* s) : RacingGlooStore(nullptr, 2), s_(s) {}
    void set(const std::string& key, const std::vector<char>& data) override {
      int rank = 0;
      if (absl::SimpleAtoi(key, &rank)) {
        for (int i = 0; i < 3 * kMaxPendingConnections; ++i) {
          s_->Attack(data, rank, 2);
        }
      }
      RacingGlooStore::set(key, data);
    }

   private:
    Strangers* s_;
  };
  Strangers strangers(Stranger::kSilent);
  FloodStore store(&strangers);
  auto counters = std::make_shared<PairAuthCounters>();
  std::vector<Formed> mesh = FormMesh(
      2, store, [&](int) { return Authenticated(kKey, counters); },
      std::chrono::seconds(10));
  for (int r = 0; r < 2; ++r) {
    ASSERT_NE(mesh[r].context, nullptr) << mesh[r].error;
  }
  EXPECT_EQ(CheckAllreduce(mesh), "");
}

TEST(GlooPairAuthTest, PeerWithAnotherKeyIsRefusedAndNamed) {
  RacingGlooStore store(nullptr, 2);
  auto counters = std::make_shared<PairAuthCounters>();
  const auto start = std::chrono::steady_clock::now();
  std::vector<Formed> mesh = FormMesh(
      2, store,
      [&](int r) {
        return Authenticated(std::string(kPairKeyBytes, r == 0 ? 'a' : 'b'),
                             counters);
      },
      std::chrono::seconds(1));
  // The listening side waits one pair timeout; the refusal adds nothing.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(9));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(mesh[r].context, nullptr) << "node " << r << " formed";
  }
  EXPECT_EQ(counters->authenticated.load(), 0u);
  EXPECT_GE(counters->refused.load(), 1u);
  // One side is the client: it names the listener that failed its check;
  // the other listened and says why it refused the connection.
  const std::string both = mesh[0].error + "\n" + mesh[1].error;
  EXPECT_THAT(both, HasSubstr("did not prove membership"));
  EXPECT_THAT(both, HasSubstr("node 'host-"));
  EXPECT_THAT(both, HasSubstr("does not verify"));
}

// The same race through GlooBackend and the real rendezvous service: the
// backend forms and its AllreduceSum is exact.
// Before a node publishes its pair addresses (the key "<round>/mesh/<rank>"),
// the strangers attack them.
std::unique_ptr<FakeRendezvousStore> RacingStore(
    RendezvousStoreInterface* inner, Strangers* strangers, int n) {
  FakeRendezvousStore::Options options;
  options.inner = inner;
  options.before_set = [strangers, n](absl::string_view key,
                                      absl::string_view value) {
    const size_t slash = key.rfind('/');
    int rank = 0;
    if (slash != absl::string_view::npos &&
        absl::EndsWith(key.substr(0, slash), "/mesh") &&
        absl::SimpleAtoi(key.substr(slash + 1), &rank)) {
      strangers->Attack(std::vector<char>(value.begin(), value.end()), rank, n);
    }
  };
  return std::make_unique<FakeRendezvousStore>(std::move(options));
}

TEST(GlooPairAuthTest, GlooBackendFormsDespiteAStrangerAndSumsExactly) {
  auto server = RendezvousServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  constexpr int kNodes = 2;
  Strangers strangers(Stranger::kGlooUnboundSend);
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  std::vector<std::unique_ptr<FakeRendezvousStore>> stores;
  for (int r = 0; r < kNodes; ++r) {
    RendezvousClient::Options options;
    options.address = (*server)->address();
    auto client = RendezvousClient::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    clients.push_back(*std::move(client));
    stores.push_back(RacingStore(clients.back().get(), &strangers, kNodes));
  }
  std::vector<std::unique_ptr<GlooBackend>> backends(kNodes);
  std::vector<absl::Status> status(kNodes);
  std::vector<std::thread> threads;
  for (int r = 0; r < kNodes; ++r) {
    threads.emplace_back([&, r] {
      GlooBackend::Options options;
      options.store = stores[r].get();
      options.job_id = "job";
      options.node_rank = r;
      options.num_nodes = kNodes;
      options.connect_timeout = absl::Seconds(20);
      options.collective_timeout = absl::Seconds(10);
      auto backend = GlooBackend::Create(options);
      status[r] = backend.status();
      if (backend.ok()) backends[r] = *std::move(backend);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kNodes; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
  EXPECT_EQ(strangers.connections(), 2);
  EXPECT_GE(backends[0]->RefusedPairConnections() +
                backends[1]->RefusedPairConnections(),
            1u);
  constexpr size_t kCount = 70001;
  std::vector<std::vector<float>> data(kNodes, std::vector<float>(kCount));
  threads.clear();
  for (int r = 0; r < kNodes; ++r) {
    for (size_t i = 0; i < kCount; ++i) data[r][i] = (r + 1) * 0.5f + i % 13;
    threads.emplace_back([&, r] {
      status[r] =
          backends[r]->AllreduceSum(data[r].data(), kCount, DType::kFloat32);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kNodes; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(data[r][i], 1.5f + 2.0f * (i % 13)) << "node " << r << " " << i;
    }
  }
}

}  // namespace
}  // namespace gradd
