// GlooBackend with several nodes as threads over the real rendezvous service
// on loopback.
#include "server/backends/gloo/gloo_backend.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rendezvous/rendezvous_client.h"
#include "server/rendezvous/rendezvous_service.h"

namespace gradd {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

// Runs fn(rank) on one thread per node and waits for all.
void OnEachNode(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

class GlooBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = RendezvousServer::Start("127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<RendezvousClient> NewClient() {
    RendezvousClient::Options options;
    options.address = server_->address();
    auto client = RendezvousClient::Create(options);
    EXPECT_TRUE(client.ok());
    return *std::move(client);
  }

  // Creates `n` connected backends concurrently (one thread per node).
  std::vector<std::unique_ptr<GlooBackend>> Connect(
      int n, absl::Duration collective_timeout = absl::Seconds(20),
      GlooBackend::Algorithm algorithm = GlooBackend::Algorithm::kAuto) {
    // Backends use their store after Create(); keep the clients alive.
    std::vector<std::unique_ptr<RendezvousClient>>& clients =
        clients_.emplace_back();
    for (int r = 0; r < n; ++r) clients.push_back(NewClient());
    std::vector<std::unique_ptr<GlooBackend>> backends(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        GlooBackend::Options options;
        options.store = clients[r].get();
        options.job_id = "job";
        options.algorithm = algorithm;
        options.node_rank = r;
        options.num_nodes = n;
        options.connect_timeout = absl::Seconds(20);
        options.collective_timeout = collective_timeout;
        for (int i = 0; i < n; ++i) {
          options.node_names.push_back(absl::StrCat("host-", i));
        }
        auto backend = GlooBackend::Create(options);
        ASSERT_TRUE(backend.ok()) << backend.status();
        backends[r] = *std::move(backend);
      });
    }
    for (auto& t : threads) t.join();
    return backends;
  }

  std::unique_ptr<RendezvousServer> server_;
  std::vector<std::vector<std::unique_ptr<RendezvousClient>>> clients_;
};

template <typename T>
void CheckAllreduce(std::vector<std::unique_ptr<GlooBackend>>& backends,
                    size_t count, DType dtype) {
  const int n = static_cast<int>(backends.size());
  std::vector<std::vector<T>> data(n, std::vector<T>(count));
  for (int r = 0; r < n; ++r) {
    // Integers (exactly representable, and so is their sum) with a fraction
    // that keeps the sum exact too.
    for (size_t i = 0; i < count; ++i) {
      data[r][i] = static_cast<T>((i % 1000) * (r + 1)) + T(0.25) * (r + 1);
    }
  }
  std::vector<absl::Status> status(n);
  OnEachNode(n, [&](int r) {
    status[r] = backends[r]->AllreduceSum(data[r].data(), count, dtype);
  });
  const T rank_sum = static_cast<T>(n * (n + 1) / 2);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    for (size_t i = 0; i < count; ++i) {
      const T expected =
          static_cast<T>(i % 1000) * rank_sum + T(0.25) * rank_sum;
      ASSERT_EQ(data[r][i], expected)
          << "node " << r << " element " << i << " of " << count;
    }
  }
}

TEST_F(GlooBackendTest, AllreduceSumIsExactForThreeNodes) {
  auto backends = Connect(3);
  ASSERT_EQ(backends.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    ASSERT_NE(backends[r], nullptr);
    EXPECT_EQ(backends[r]->node_rank(), r);
    EXPECT_EQ(backends[r]->num_nodes(), 3);
  }
  // Sizes straddling Gloo's 1 MiB segment and odd counts.
  for (size_t count :
       {size_t{1}, size_t{7}, size_t{1024}, size_t{262147}, size_t{1} << 20}) {
    CheckAllreduce<float>(backends, count, DType::kFloat32);
    CheckAllreduce<double>(backends, count, DType::kFloat64);
  }
}

TEST_F(GlooBackendTest, AllreduceBcubeIsExactForTwoNodes) {
  auto backends = Connect(2, absl::Seconds(20), GlooBackend::Algorithm::kBcube);
  CheckAllreduce<float>(backends, 300001, DType::kFloat32);
  CheckAllreduce<double>(backends, 5, DType::kFloat64);
}

TEST_F(GlooBackendTest, RejectsNonAccumulatorDType) {
  auto backends = Connect(2);
  uint16_t half[4] = {};
  EXPECT_EQ(backends[0]->AllreduceSum(half, 4, DType::kFloat16).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GlooBackendTest, BroadcastCopiesRootBytes) {
  auto backends = Connect(3);
  for (int root : {0, 2}) {
    std::vector<std::vector<uint8_t>> data(3, std::vector<uint8_t>(100003));
    for (size_t i = 0; i < data[root].size(); ++i) {
      data[root][i] = static_cast<uint8_t>(i * 7 + root);
    }
    std::vector<absl::Status> status(3);
    OnEachNode(3, [&](int r) {
      status[r] = backends[r]->Broadcast(data[r].data(), data[r].size(), root);
    });
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(status[r].ok()) << status[r];
      EXPECT_EQ(data[r], data[root]) << "node " << r << " root " << root;
    }
  }
}

TEST_F(GlooBackendTest, SingleNodeNeedsNoStore) {
  GlooBackend::Options options;
  options.num_nodes = 1;
  auto backend = GlooBackend::Create(options);
  ASSERT_TRUE(backend.ok()) << backend.status();
  float x[3] = {1, 2, 3};
  EXPECT_TRUE((*backend)->AllreduceSum(x, 3, DType::kFloat32).ok());
  EXPECT_EQ(x[2], 3.0f);
}

TEST_F(GlooBackendTest, MissingNodeFailsCreateNamingIt) {
  auto client = NewClient();
  GlooBackend::Options options;
  options.store = client.get();
  options.job_id = "job";
  options.node_rank = 0;
  options.num_nodes = 2;
  options.node_names = {"host-0", "host-1"};
  options.connect_timeout = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  auto backend = GlooBackend::Create(options);
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kDeadlineExceeded)
      << backend.status();
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("host-1"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(GlooBackendTest, PeerThatLeavesMakesOthersFailWithinTimeout) {
  const absl::Duration timeout = absl::Seconds(5);
  auto backends = Connect(3, timeout);
  // One good round first.
  CheckAllreduce<float>(backends, 1000, DType::kFloat32);
  // Node 2 leaves.
  backends[2].reset();
  std::vector<absl::Status> status(2);
  const absl::Time start = absl::Now();
  OnEachNode(2, [&](int r) {
    std::vector<float> data(1 << 16, 1.0f);
    status[r] =
        backends[r]->AllreduceSum(data.data(), data.size(), DType::kFloat32);
  });
  const absl::Duration took = absl::Now() - start;
  EXPECT_LT(took, timeout + absl::Seconds(3));
  for (int r = 0; r < 2; ++r) {
    std::cout << "survivor " << r << ": " << status[r] << "\n";
    EXPECT_THAT(status[r].code(), AnyOf(absl::StatusCode::kUnavailable,
                                        absl::StatusCode::kDeadlineExceeded))
        << status[r];
    EXPECT_THAT(std::string(status[r].message()), HasSubstr("job 'job'"));
  }
  // Both survivors name the node that left, and only it.
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(std::string(status[r].message()), HasSubstr("'host-2'"));
    EXPECT_THAT(std::string(status[r].message()),
                ::testing::Not(HasSubstr("peer node 'host-1'")));
  }
  // Broken for good: the same error again, immediately.
  std::vector<float> data(4, 1.0f);
  EXPECT_EQ(backends[0]->AllreduceSum(data.data(), 4, DType::kFloat32).code(),
            status[0].code());
}

TEST_F(GlooBackendTest, PeerThatStopsCallingTimesOut) {
  const absl::Duration timeout = absl::Seconds(2);
  auto backends = Connect(2, timeout);
  // Node 1 is alive but never joins the collective.
  std::vector<float> data(1024, 1.0f);
  const absl::Time start = absl::Now();
  absl::Status s =
      backends[0]->AllreduceSum(data.data(), data.size(), DType::kFloat32);
  const absl::Duration took = absl::Now() - start;
  std::cout << s << "\n";
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(took, timeout - absl::Milliseconds(100));
  EXPECT_LT(took, timeout + absl::Seconds(3));
}

TEST_F(GlooBackendTest, HungPeerAmongThreeIsNamedByTheOthers) {
  const absl::Duration timeout = absl::Seconds(2);
  auto backends = Connect(3, timeout);
  // Node 2 stays connected but never joins the collective.
  std::vector<absl::Status> status(2);
  const absl::Time start = absl::Now();
  OnEachNode(2, [&](int r) {
    std::vector<float> data(1 << 18, 1.0f);
    status[r] =
        backends[r]->AllreduceSum(data.data(), data.size(), DType::kFloat32);
  });
  // The timeout plus at most the 200 ms probe (and scheduling slack).
  EXPECT_LT(absl::Now() - start, timeout + absl::Seconds(2));
  for (int r = 0; r < 2; ++r) {
    std::cout << "waiting node " << r << ": " << status[r] << "\n";
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDeadlineExceeded)
        << status[r];
    EXPECT_THAT(std::string(status[r].message()), HasSubstr("'host-2'"));
  }
}

}  // namespace
}  // namespace gradd
