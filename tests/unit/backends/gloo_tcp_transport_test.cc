// gradd's Gloo transport (server/backends/gloo/authenticated_tcp.h) as a
// transport: Gloo's collectives are exact over it, messages on one slot
// match in posting order, a receive posted after its message arrived gets
// it, waits time out, abort and fail as Gloo's do, and a pair's failure
// names the peer's address. Ranks run as threads over Gloo's in-memory
// store, on loopback.
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gloo/allreduce.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/transport/unbound_buffer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/auth/pair_handshake.h"
#include "server/backends/gloo/authenticated_tcp.h"

namespace gradd {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

using Mesh = std::vector<std::shared_ptr<gloo::rendezvous::Context>>;

// An n-rank mesh on gradd's transport; every rank has its own device.
Mesh FormMesh(int n, milliseconds timeout = milliseconds(10000)) {
  gloo::rendezvous::HashStore store;
  Mesh mesh(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        PairAuthOptions options;
        options.key = std::string(kPairKeyBytes, 'k');
        options.job_id = "job";
        std::shared_ptr<gloo::transport::Device> device =
            CreateAuthenticatedTcpDevice("127.0.0.1", options, nullptr).value();
        auto context = std::make_shared<gloo::rendezvous::Context>(r, n);
        context->setTimeout(timeout);
        context->connectFullMesh(store, device);
        mesh[r] = std::move(context);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(mesh[r], nullptr) << "rank " << r << ": " << errors[r];
  }
  return mesh;
}

// Runs fn(rank) on one thread per rank; returns what each threw ("" if
// nothing).
std::vector<std::string> OnEveryRank(int n,
                                     const std::function<void(int)>& fn) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void SumFloats(void* c, const void* a, const void* b, size_t n) {
  gloo::sum<float>(c, a, b, n);
}

struct AllreduceCase {
  int ranks;
  size_t count;
  gloo::AllreduceOptions::Algorithm algorithm;
};

class TransportAllreduceTest : public ::testing::TestWithParam<AllreduceCase> {
};

TEST_P(TransportAllreduceTest, SumsExactly) {
  const AllreduceCase c = GetParam();
  Mesh mesh = FormMesh(c.ranks);
  ASSERT_EQ(std::count(mesh.begin(), mesh.end(), nullptr), 0);
  std::vector<std::vector<float>> data(c.ranks, std::vector<float>(c.count));
  for (int r = 0; r < c.ranks; ++r) {
    for (size_t i = 0; i < c.count; ++i) data[r][i] = (r + 1) * (i % 101);
  }
  // Twice: the second collective reuses the connections with new slots.
  for (int round = 0; round < 2; ++round) {
    std::vector<std::string> errors = OnEveryRank(c.ranks, [&](int r) {
      gloo::AllreduceOptions opts(mesh[r]);
      opts.setOutput(data[r].data(), c.count);
      opts.setReduceFunction(&SumFloats);
      opts.setAlgorithm(c.algorithm);
      opts.setTag(round);
      opts.setTimeout(milliseconds(10000));
      gloo::allreduce(opts);
    });
    for (int r = 0; r < c.ranks; ++r) {
      ASSERT_EQ(errors[r], "") << "rank " << r;
    }
  }
  // After two rounds every element is the rank factors' sum times the
  // number of ranks.
  const float factor = c.ranks * (c.ranks + 1) / 2 * c.ranks;
  for (int r = 0; r < c.ranks; ++r) {
    for (size_t i = 0; i < c.count; ++i) {
      ASSERT_EQ(data[r][i], factor * (i % 101))
          << "rank " << r << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ranks, TransportAllreduceTest,
    ::testing::Values(
        AllreduceCase{2, 1000, gloo::AllreduceOptions::Algorithm::RING},
        AllreduceCase{2, 1000, gloo::AllreduceOptions::Algorithm::BCUBE},
        AllreduceCase{3, 300001, gloo::AllreduceOptions::Algorithm::RING},
        AllreduceCase{3, 4099, gloo::AllreduceOptions::Algorithm::BCUBE},
        AllreduceCase{4, 300001, gloo::AllreduceOptions::Algorithm::RING},
        AllreduceCase{4, 4099, gloo::AllreduceOptions::Algorithm::BCUBE}));

TEST(GlooTcpTransportTest, BroadcastReachesEveryRank) {
  constexpr int kRanks = 3;
  Mesh mesh = FormMesh(kRanks);
  ASSERT_EQ(std::count(mesh.begin(), mesh.end(), nullptr), 0);
  constexpr size_t kBytes = (3 << 20) + 7;
  std::vector<std::vector<uint8_t>> data(kRanks,
                                         std::vector<uint8_t>(kBytes, 0));
  for (size_t i = 0; i < kBytes; ++i) data[1][i] = static_cast<uint8_t>(i * 7);
  std::vector<std::string> errors = OnEveryRank(kRanks, [&](int r) {
    gloo::BroadcastOptions opts(mesh[r]);
    opts.setOutput(data[r].data(), kBytes);
    opts.setRoot(1);
    opts.setTimeout(milliseconds(10000));
    gloo::broadcast(opts);
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(data[r], data[1]) << "rank " << r;
  }
}

TEST(GlooTcpTransportTest, MessagesOnOneSlotMatchInPostingOrder) {
  Mesh mesh = FormMesh(2);
  ASSERT_EQ(std::count(mesh.begin(), mesh.end(), nullptr), 0);
  constexpr int kMessages = 50;
  constexpr size_t kEach = 1000;
  constexpr uint64_t kSlot = 7;
  std::vector<int> sent(kMessages * kEach);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<int>(i);
  std::vector<int> got(sent.size(), -1);
  std::vector<int> from;
  std::vector<std::string> errors = OnEveryRank(2, [&](int r) {
    if (r == 1) {
      auto buf =
          mesh[1]->createUnboundBuffer(sent.data(), sent.size() * sizeof(int));
      for (int m = 0; m < kMessages; ++m) {
        buf->send(0, kSlot, m * kEach * sizeof(int), kEach * sizeof(int));
      }
      for (int m = 0; m < kMessages; ++m) buf->waitSend(milliseconds(10000));
      return;
    }
    // Half the receives are posted before the sender starts (probably),
    // half while messages are already arriving.
    auto buf =
        mesh[0]->createUnboundBuffer(got.data(), got.size() * sizeof(int));
    for (int m = 0; m < kMessages; ++m) {
      buf->recv(1, kSlot, m * kEach * sizeof(int), kEach * sizeof(int));
    }
    for (int m = 0; m < kMessages; ++m) {
      int rank = -1;
      ASSERT_TRUE(buf->waitRecv(&rank, milliseconds(10000)));
      from.push_back(rank);
    }
  });
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  EXPECT_EQ(got, sent);
  EXPECT_EQ(from, std::vector<int>(kMessages, 1));
}

TEST(GlooTcpTransportTest, ReceivePostedAfterItsMessageArrivedGetsIt) {
  Mesh mesh = FormMesh(2);
  ASSERT_EQ(std::count(mesh.begin(), mesh.end(), nullptr), 0);
  constexpr uint64_t kEarly = 1;
  constexpr uint64_t kLate = 2;
  std::vector<char> early(1 << 20, 'e');
  std::vector<char> late(100, 'l');
  auto out_early = mesh[1]->createUnboundBuffer(early.data(), early.size());
  auto out_late = mesh[1]->createUnboundBuffer(late.data(), late.size());
  out_early->send(0, kEarly);
  out_late->send(0, kLate);
  std::vector<char> in_early(early.size());
  std::vector<char> in_late(late.size());
  auto recv_early =
      mesh[0]->createUnboundBuffer(in_early.data(), in_early.size());
  auto recv_late = mesh[0]->createUnboundBuffer(in_late.data(), in_late.size());
  // The pair reads its frames in order: once the later message is here, the
  // earlier one has been read, with no receive posted for it.
  recv_late->recv(1, kLate);
  ASSERT_TRUE(recv_late->waitRecv(milliseconds(10000)));
  recv_early->recv(1, kEarly);
  ASSERT_TRUE(recv_early->waitRecv(milliseconds(10000)));
  EXPECT_EQ(in_early, early);
  EXPECT_EQ(in_late, late);
  EXPECT_TRUE(out_early->waitSend(milliseconds(10000)));
  EXPECT_TRUE(out_late->waitSend(milliseconds(10000)));
}

TEST(GlooTcpTransportTest, WaitRecvTimesOutLikeGloo) {
  Mesh mesh = FormMesh(2);
  ASSERT_EQ(std::count(mesh.begin(), mesh.end(), nullptr), 0);
  char byte = 0;
  auto buf = mesh[0]->createUnboundBuffer(&byte, 1);
  buf->recv(1, 3);
  const auto start = std::chrono::steady_clock::now();
  try {
    buf->waitRecv(milliseconds(200));
    FAIL() << "waitRecv returned";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("Timed out waiting 200ms for recv operation to "
                          "complete"));
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(200));
  // As in Gloo, the timeout failed the context's pairs: the peer's next
  // receive fails promptly (as it is posted or waited for) instead of at
  // its own timeout, and it learns that rank 0 timed out.
  const std::string address = mesh[0]->getPair(1)->address().str();
  auto peer = mesh[1]->createUnboundBuffer(&byte, 1);
  const auto peer_start = std::chrono::steady_clock::now();
  try {
    peer->recv(0, 3);
    peer->waitRecv(milliseconds(10000));
    FAIL() << "the peer's waitRecv returned";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(), HasSubstr(absl::StrCat(
                              "Peer ", address,
                              " ended the connection: Timed out waiting "
                              "200ms for recv operation to complete")));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - peer_start, milliseconds(5000));
}

TEST(GlooTcpTransportTest, PeerClosingFailsPendingWaitsNamingItsAddress) {
  Mesh mesh = FormMesh(3);
  ASSERT_EQ(std::count(mesh.begin(), mesh.end(), nullptr), 0);
  // Rank 2's published address: how rank 0's errors name it.
  const std::string address = mesh[2]->getPair(0)->address().str();
  std::vector<char> in(8 << 20);
  auto buf = mesh[0]->createUnboundBuffer(in.data(), in.size());
  buf->recv(2, 9);
  // Rank 2 sends part of what rank 0 waits for, then goes away.
  std::vector<char> part(1 << 20, 'p');
  auto out = mesh[2]->createUnboundBuffer(part.data(), part.size());
  out->send(0, 8);
  ASSERT_TRUE(out->waitSend(milliseconds(10000)));
  mesh[2]->closeConnections();
  try {
    buf->waitRecv(milliseconds(10000));
    FAIL() << "waitRecv returned";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(), HasSubstr(address));
    EXPECT_THAT(e.what(), HasSubstr("closed by peer"));
  }
  // Later operations on that pair fail at once; the other pair still works.
  EXPECT_THROW(buf->send(2, 10, 0, 1), gloo::IoException);
  char one = 'x';
  char got = 0;
  auto to1 = mesh[0]->createUnboundBuffer(&one, 1);
  auto from0 = mesh[1]->createUnboundBuffer(&got, 1);
  to1->send(1, 11);
  from0->recv(0, 11);
  ASSERT_TRUE(from0->waitRecv(milliseconds(10000)));
  EXPECT_EQ(got, 'x');
  EXPECT_TRUE(to1->waitSend(milliseconds(10000)));
}

// A collective whose last step is a send from the peer (a broadcast rooted
// there) ends on the peer's side first, and the peer may close before this
// side posts its receive: what arrived whole before the close is still
// delivered, and only receives of what never came fail.
TEST(GlooTcpTransportTest, MessagesSentBeforeThePeerClosedAreStillDelivered) {
  Mesh mesh = FormMesh(2);
  ASSERT_EQ(std::count(mesh.begin(), mesh.end(), nullptr), 0);
  std::vector<char> first(1000, 'a');
  std::vector<char> second(64 << 10, 'b');
  auto out_first = mesh[1]->createUnboundBuffer(first.data(), first.size());
  auto out_second = mesh[1]->createUnboundBuffer(second.data(), second.size());
  out_first->send(0, 5);
  out_second->send(0, 6);
  ASSERT_TRUE(out_first->waitSend(milliseconds(10000)));
  ASSERT_TRUE(out_second->waitSend(milliseconds(10000)));
  mesh[1]->closeConnections();
  // The pair reads in order: once a receive of something never sent fails
  // on the close, both messages have been read with no receive posted.
  char never = 0;
  auto pending = mesh[0]->createUnboundBuffer(&never, 1);
  pending->recv(1, 7);
  try {
    pending->waitRecv(milliseconds(10000));
    FAIL() << "waitRecv of a message never sent returned";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(), HasSubstr("closed by peer"));
  }
  std::vector<char> in_second(second.size());
  std::vector<char> in_first(first.size());
  auto recv_second =
      mesh[0]->createUnboundBuffer(in_second.data(), in_second.size());
  auto recv_first =
      mesh[0]->createUnboundBuffer(in_first.data(), in_first.size());
  recv_second->recv(1, 6);
  ASSERT_TRUE(recv_second->waitRecv(milliseconds(10000)));
  recv_first->recv(1, 5);
  ASSERT_TRUE(recv_first->waitRecv(milliseconds(10000)));
  EXPECT_EQ(in_first, first);
  EXPECT_EQ(in_second, second);
  // Nothing more came: a further receive fails at once, naming the close.
  auto after = mesh[0]->createUnboundBuffer(&never, 1);
  try {
    after->recv(1, 5);
    after->waitRecv(milliseconds(10000));
    FAIL() << "a receive after the delivered ones returned";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(), HasSubstr("closed by peer"));
  }
}

TEST(GlooTcpTransportTest, AbortEndsAWaitWithFalse) {
  Mesh mesh = FormMesh(2);
  ASSERT_EQ(std::count(mesh.begin(), mesh.end(), nullptr), 0);
  char byte = 0;
  auto buf = mesh[0]->createUnboundBuffer(&byte, 1);
  // An abort before the wait ends the next wait.
  buf->abortWaitSend();
  EXPECT_FALSE(buf->waitSend(milliseconds(10000)));
  // An abort from another thread ends a wait in progress.
  buf->recv(1, 4);
  bool completed = true;
  std::thread waiter([&] { completed = buf->waitRecv(milliseconds(30000)); });
  buf->abortWaitRecv();
  waiter.join();
  EXPECT_FALSE(completed);
  // The receive is still posted: the message still lands in it.
  char x = 'z';
  auto out = mesh[1]->createUnboundBuffer(&x, 1);
  out->send(0, 4);
  EXPECT_TRUE(buf->waitRecv(milliseconds(10000)));
  EXPECT_EQ(byte, 'z');
}

TEST(GlooTcpTransportTest, SizeMismatchFailsThePair) {
  Mesh mesh = FormMesh(2);
  ASSERT_EQ(std::count(mesh.begin(), mesh.end(), nullptr), 0);
  std::vector<char> in(10);
  std::vector<char> out(20, 'o');
  auto rb = mesh[0]->createUnboundBuffer(in.data(), in.size());
  auto sb = mesh[1]->createUnboundBuffer(out.data(), out.size());
  rb->recv(1, 5);
  sb->send(0, 5);
  try {
    rb->waitRecv(milliseconds(10000));
    FAIL() << "waitRecv returned";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(), HasSubstr("Message of 20 bytes"));
  }
}

TEST(GlooTcpTransportTest, UnsupportedOperationsSaySo) {
  Mesh mesh = FormMesh(3);
  ASSERT_EQ(std::count(mesh.begin(), mesh.end(), nullptr), 0);
  char byte = 0;
  auto buf = mesh[0]->createUnboundBuffer(&byte, 1);
  EXPECT_THROW(buf->recv(std::vector<int>{1, 2}, 1), gloo::Exception);
  EXPECT_THROW(mesh[0]->getPair(1)->createSendBuffer(0, &byte, 1),
               gloo::Exception);
  EXPECT_THROW(buf->send(0, 1), gloo::Exception);        // No pair to itself.
  EXPECT_THROW(buf->send(1, 1, 0, 2), gloo::Exception);  // Past the end.
}

TEST(GlooTcpTransportTest, AddressRoundTripsAndRejectsOtherBytes) {
  Mesh mesh = FormMesh(2);
  ASSERT_EQ(std::count(mesh.begin(), mesh.end(), nullptr), 0);
  const gloo::transport::Address& a = mesh[1]->getPair(0)->address();
  absl::StatusOr<PairAddress> parsed = PairAddress::Parse(a.bytes());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->str(), a.str());
  EXPECT_EQ(parsed->rank(), 1);
  EXPECT_THAT(a.str(), HasSubstr("127.0.0.1:"));
  EXPECT_FALSE(
      PairAddress::Parse(std::vector<char>(a.bytes().size(), 'x')).ok());
  EXPECT_FALSE(PairAddress::Parse({}).ok());
}

TEST(GlooTcpTransportTest, HostThatDoesNotResolveIsAnError) {
  PairAuthOptions options;
  options.key = std::string(kPairKeyBytes, 'k');
  EXPECT_FALSE(
      CreateAuthenticatedTcpDevice("no-such-host.invalid", options, nullptr)
          .ok());
  options.key = "short";
  EXPECT_FALSE(
      CreateAuthenticatedTcpDevice("127.0.0.1", options, nullptr).ok());
}

}  // namespace
}  // namespace gradd
