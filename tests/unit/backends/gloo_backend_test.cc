// GlooBackend with several nodes as threads over the real rendezvous service
// on loopback.
#include "server/backends/gloo/gloo_backend.h"

#include <cmath>
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
#include "common/reduce.h"
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
        GlooBackend::Options options = base_options_;
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
  // Connect() starts every node's options from these.
  GlooBackend::Options base_options_;
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

// Value of global rank g at element i: exact in float and double, and so
// are the sums and averages the tests below use (see there).
template <typename T>
T RankValue(int g, size_t i) {
  return static_cast<T>((i % 1000) * (g + 1)) + T(0.25) * (g + 1);
}

// AllreduceAverage with locals[r] local buffers on node r. pre_summed: the
// caller has already summed node r's buffers into its first one (to_sum 1;
// the others hold junk that must be overwritten).
template <typename T>
void CheckAverage(std::vector<std::unique_ptr<GlooBackend>>& backends,
                  const std::vector<int>& locals, size_t count, DType dtype,
                  bool pre_summed) {
  const int n = static_cast<int>(backends.size());
  std::vector<int> offset(n, 0);
  for (int r = 1; r < n; ++r) offset[r] = offset[r - 1] + locals[r - 1];
  const int world = offset[n - 1] + locals[n - 1];
  // buffers[r][k]: local rank k of node r, global rank offset[r] + k.
  std::vector<std::vector<std::vector<T>>> buffers(n);
  std::vector<LocalAverage> work(n);
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < locals[r]; ++k) {
      std::vector<T>& b = buffers[r].emplace_back(count);
      for (size_t i = 0; i < count; ++i) b[i] = RankValue<T>(offset[r] + k, i);
    }
    if (pre_summed) {
      for (size_t i = 0; i < count; ++i) {
        for (int k = 1; k < locals[r]; ++k) {
          buffers[r][0][i] += buffers[r][k][i];
          buffers[r][k][i] = T(-7);
        }
      }
    }
    work[r].dtype = dtype;
    for (auto& b : buffers[r]) work[r].buffers.push_back(b.data());
    work[r].to_sum = pre_summed ? 1 : locals[r];
    work[r].count = count;
    work[r].divisor = world;
  }
  std::vector<absl::Status> status(n);
  OnEachNode(
      n, [&](int r) { status[r] = backends[r]->AllreduceAverage(work[r]); });
  // sum_g (g + 1) * x = x * world * (world + 1) / 2.
  const T rank_sum = static_cast<T>(world * (world + 1) / 2);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    for (int k = 0; k < locals[r]; ++k) {
      for (size_t i = 0; i < count; ++i) {
        const T expected =
            (static_cast<T>(i % 1000) * rank_sum + T(0.25) * rank_sum) /
            static_cast<T>(world);
        ASSERT_EQ(buffers[r][k][i], expected)
            << "node " << r << " local rank " << k << " element " << i << " of "
            << count << (pre_summed ? " (pre-summed)" : "");
      }
    }
  }
}

TEST_F(GlooBackendTest, AllreduceAverageIsExactForThreeUnevenNodes) {
  // Small segments: many per shard, more than the receive slots, so slots
  // are reused; counts that do not split evenly into shards or segments.
  base_options_.fused_segment_bytes = 64 << 10;
  base_options_.fused_min_bytes = 256 << 10;
  auto backends = Connect(3);
  // World 6, rank sum 21: averages are multiples of 1/8, exact.
  const std::vector<int> locals = {2, 1, 3};
  for (bool pre_summed : {false, true}) {
    // 300001 floats and 150007 doubles take the fused ring; 1000 elements
    // the default path (local sum, AllreduceSum, write-back).
    CheckAverage<float>(backends, locals, 300001, DType::kFloat32, pre_summed);
    CheckAverage<double>(backends, locals, 150007, DType::kFloat64, pre_summed);
    CheckAverage<float>(backends, locals, 1000, DType::kFloat32, pre_summed);
  }
}

TEST_F(GlooBackendTest, AllreduceAverageIsExactForTwoNodes) {
  base_options_.fused_segment_bytes = 128 << 10;
  auto backends = Connect(2);
  // World 4, rank sum 10: averages are multiples of 1/8, exact.
  CheckAverage<float>(backends, {2, 2}, (25 << 20) / 4, DType::kFloat32, false);
  CheckAverage<float>(backends, {3, 1}, 1 << 20, DType::kFloat32, true);
  // One local rank each: nothing to sum or copy locally.
  CheckAverage<double>(backends, {1, 1}, 200003, DType::kFloat64, false);
}

// A 16-bit wire (the compression hooks) through the fused ring: each
// node's float32 sum divided and rounded once to 16 bits, the nodes' values
// summed in 16 bits -- shard c starting at node c, then c + 1, ... (the
// ring's order) -- and converted back into every local rank's bucket.
void CheckSixteenBitWire(std::vector<std::unique_ptr<GlooBackend>>& backends,
                         const std::vector<int>& locals, size_t count,
                         DType wire) {
  const int n = static_cast<int>(backends.size());
  auto to16 = [wire](float f) {
    return wire == DType::kFloat16 ? FloatToHalf(f) : FloatToBFloat16(f);
  };
  auto from16 = [wire](uint16_t h) {
    return wire == DType::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
  };
  int world = 0;
  for (int l : locals) world += l;
  auto value = [](int g, size_t i) {
    return static_cast<float>(std::sin(0.001 * static_cast<double>(i) + g)) *
           static_cast<float>(g + 1);
  };
  std::vector<std::vector<std::vector<float>>> buffers(n);
  std::vector<std::vector<uint16_t>> own(n, std::vector<uint16_t>(count));
  std::vector<LocalAverage> work(n);
  int g = 0;
  for (int r = 0; r < n; ++r) {
    std::vector<float> sum(count, 0.0f);
    for (int k = 0; k < locals[r]; ++k, ++g) {
      std::vector<float>& b = buffers[r].emplace_back(count);
      for (size_t i = 0; i < count; ++i) {
        b[i] = value(g, i);
        sum[i] += b[i];
      }
    }
    for (size_t i = 0; i < count; ++i) own[r][i] = to16(sum[i] / world);
    work[r].dtype = DType::kFloat32;
    for (auto& b : buffers[r]) work[r].buffers.push_back(b.data());
    work[r].to_sum = locals[r];
    work[r].count = count;
    work[r].divisor = world;
    work[r].wire = wire;
  }
  std::vector<absl::Status> status(n);
  OnEachNode(
      n, [&](int r) { status[r] = backends[r]->AllreduceAverage(work[r]); });
  const size_t per_shard = ((count + n - 1) / n + 63) / 64 * 64;
  for (int r = 0; r < n; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
  for (size_t i = 0; i < count; ++i) {
    const int shard = static_cast<int>(i / per_shard);
    uint16_t acc = own[shard][i];
    for (int t = 1; t < n; ++t) {
      acc = to16(from16(acc) + from16(own[(shard + t) % n][i]));
    }
    const float expected = from16(acc);
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k < locals[r]; ++k) {
        ASSERT_EQ(buffers[r][k][i], expected)
            << DTypeName(wire) << " node " << r << " local rank " << k
            << " element " << i << " of " << count;
      }
    }
  }
}

// Many segments per shard, more than the receive slots; counts that do not
// split evenly. 300001 16-bit values are above fused_min_bytes (the fused
// ring), 1000 below it (compress, AllreduceSum, decompress).
TEST_F(GlooBackendTest, SixteenBitWireRidesTheFusedRingOnTwoNodes) {
  base_options_.fused_segment_bytes = 64 << 10;
  auto backends = Connect(2);
  for (DType wire : {DType::kBFloat16, DType::kFloat16}) {
    CheckSixteenBitWire(backends, {2, 2}, 300001, wire);
    CheckSixteenBitWire(backends, {2, 2}, 1000, wire);
  }
}

TEST_F(GlooBackendTest, SixteenBitWireRidesTheFusedRingOnThreeNodes) {
  base_options_.fused_segment_bytes = 64 << 10;
  auto backends = Connect(3);
  for (DType wire : {DType::kBFloat16, DType::kFloat16}) {
    CheckSixteenBitWire(backends, {1, 3, 2}, 300001, wire);
  }
}

TEST_F(GlooBackendTest, AllreduceAverageRejectsBadWork) {
  auto backends = Connect(2);
  std::vector<float> a(1 << 20), b(1 << 20);
  LocalAverage work;
  work.dtype = DType::kFloat16;
  work.buffers = {a.data(), b.data()};
  work.to_sum = 2;
  work.count = a.size();
  work.divisor = 4;
  EXPECT_EQ(backends[0]->AllreduceAverage(work).code(),
            absl::StatusCode::kInvalidArgument);
  work.dtype = DType::kFloat32;
  work.to_sum = 3;
  EXPECT_EQ(backends[0]->AllreduceAverage(work).code(),
            absl::StatusCode::kInvalidArgument);
  work.to_sum = 2;
  work.divisor = 0;
  EXPECT_EQ(backends[0]->AllreduceAverage(work).code(),
            absl::StatusCode::kInvalidArgument);
  // A 16-bit wire carries float32 buckets only.
  work.divisor = 4;
  work.dtype = DType::kFloat64;
  work.count = a.size() / 2;
  work.wire = DType::kBFloat16;
  const absl::Status s = backends[0]->AllreduceAverage(work);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("float64"));
  // Nothing was sent: both nodes still work together.
  CheckAverage<float>(backends, {2, 2}, 1 << 18, DType::kFloat32, false);
  CheckSixteenBitWire(backends, {1, 1}, 300001, DType::kBFloat16);
}

TEST_F(GlooBackendTest, RejectsNonWireDType) {
  auto backends = Connect(2);
  uint16_t data[4] = {};
  EXPECT_EQ(backends[0]->AllreduceSum(data, 4, static_cast<DType>(99)).code(),
            absl::StatusCode::kInvalidArgument);
}

// The 16-bit communication hooks put float16/bfloat16 on the wire: summed
// in float32 and rounded to 16 bits after each addition.
TEST_F(GlooBackendTest, AllreduceSumsSixteenBitWireTypes) {
  auto backends = Connect(3);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    auto to16 = [&](float f) {
      return dtype == DType::kFloat16 ? FloatToHalf(f) : FloatToBFloat16(f);
    };
    auto from16 = [&](uint16_t h) {
      return dtype == DType::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
    };
    constexpr size_t kCount = 1000;  // above one bcube step, below ring's
    std::vector<std::vector<uint16_t>> data(3, std::vector<uint16_t>(kCount));
    for (int r = 0; r < 3; ++r) {
      for (size_t i = 0; i < kCount; ++i) {
        data[r][i] = to16(0.25f * (r + 1) + static_cast<float>(i % 7));
      }
    }
    std::vector<absl::Status> status(3);
    OnEachNode(3, [&](int r) {
      status[r] = backends[r]->AllreduceSum(data[r].data(), kCount, dtype);
    });
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(status[r].ok()) << status[r];
      for (size_t i = 0; i < kCount; i += 97) {
        // Exactly representable partial sums: 1.5 + 3 * (i % 7).
        EXPECT_EQ(from16(data[r][i]), 1.5f + 3.0f * static_cast<float>(i % 7))
            << "node " << r << " element " << i;
      }
    }
  }
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

// Three nodes, one good round, then node 2 ('host-2') leaves and nodes 0
// and 1 run `call`: both must fail within the timeout naming host-2 and
// only it. Returns their statuses.
std::vector<absl::Status> SurvivorsOfALeavingPeer(
    std::vector<std::unique_ptr<GlooBackend>>& backends, absl::Duration timeout,
    const std::function<absl::Status(GlooBackend&)>& call) {
  CheckAllreduce<float>(backends, 1000, DType::kFloat32);
  backends[2].reset();
  std::vector<absl::Status> status(2);
  const absl::Time start = absl::Now();
  OnEachNode(2, [&](int r) { status[r] = call(*backends[r]); });
  EXPECT_LT(absl::Now() - start, timeout + absl::Seconds(3));
  for (int r = 0; r < 2; ++r) {
    std::cout << "survivor " << r << ": " << status[r] << "\n";
    EXPECT_THAT(status[r].code(), AnyOf(absl::StatusCode::kUnavailable,
                                        absl::StatusCode::kDeadlineExceeded))
        << status[r];
    EXPECT_THAT(std::string(status[r].message()), HasSubstr("job 'job'"));
    EXPECT_THAT(std::string(status[r].message()), HasSubstr("'host-2'"));
    EXPECT_THAT(std::string(status[r].message()),
                ::testing::Not(HasSubstr("peer node 'host-1'")));
  }
  return status;
}

TEST_F(GlooBackendTest, PeerThatLeavesMakesOthersFailWithinTimeout) {
  const absl::Duration timeout = absl::Seconds(5);
  auto backends = Connect(3, timeout);
  std::vector<absl::Status> status =
      SurvivorsOfALeavingPeer(backends, timeout, [](GlooBackend& b) {
        std::vector<float> data(1 << 16, 1.0f);
        return b.AllreduceSum(data.data(), data.size(), DType::kFloat32);
      });
  // Broken for good: the same error again, immediately.
  std::vector<float> data(4, 1.0f);
  EXPECT_EQ(backends[0]->AllreduceSum(data.data(), 4, DType::kFloat32).code(),
            status[0].code());
}

TEST_F(GlooBackendTest, PeerThatLeavesDuringFusedAverageIsNamed) {
  const absl::Duration timeout = absl::Seconds(5);
  auto backends = Connect(3, timeout);
  SurvivorsOfALeavingPeer(backends, timeout, [](GlooBackend& b) {
    // 8 MiB per node: the fused ring.
    std::vector<float> x(1 << 20, 1.0f), y(1 << 20, 2.0f);
    LocalAverage work;
    work.buffers = {x.data(), y.data()};
    work.to_sum = 2;
    work.count = x.size();
    work.divisor = 6;
    return b.AllreduceAverage(work);
  });
}

TEST_F(GlooBackendTest, WithoutTheProbeALeavingPeerFailsTheOthersNamingNone) {
  // Elastic jobs: no "who is still here" round (the re-formation finds the
  // lost nodes), so no survivor marks the store and none names a peer it
  // cannot be sure of.
  base_options_.failure_probe_timeout = absl::ZeroDuration();
  base_options_.store_prefix = "noprobe";
  const absl::Duration timeout = absl::Seconds(5);
  auto backends = Connect(3, timeout);
  CheckAllreduce<float>(backends, 1000, DType::kFloat32);
  backends[2].reset();
  std::vector<absl::Status> status(2);
  OnEachNode(2, [&](int r) {
    std::vector<float> data(1 << 16, 1.0f);
    status[r] =
        backends[r]->AllreduceSum(data.data(), data.size(), DType::kFloat32);
  });
  std::unique_ptr<RendezvousClient> client = NewClient();
  for (int r = 0; r < 2; ++r) {
    std::cout << "survivor " << r << ": " << status[r] << "\n";
    EXPECT_THAT(status[r].code(), AnyOf(absl::StatusCode::kUnavailable,
                                        absl::StatusCode::kDeadlineExceeded))
        << status[r];
    EXPECT_THAT(std::string(status[r].message()), HasSubstr("a peer node"));
    EXPECT_THAT(std::string(status[r].message()),
                ::testing::Not(HasSubstr("peer node 'host-")));
    absl::StatusOr<std::string> mark = client->Get(
        "job", absl::StrCat("noprobe/failed/", r), absl::Milliseconds(200));
    EXPECT_EQ(mark.status().code(), absl::StatusCode::kDeadlineExceeded)
        << "node " << r << " ran the probe";
  }
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
