// The in-process fake backend behaves like the real ones.
#include "server/backends/fake_collective_backend.h"

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

void OnEachNode(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

TEST(FakeCollectiveBackendTest, AllreduceAndBroadcast) {
  auto nodes = FakeCollectiveBackend::CreateGroup(3);
  std::vector<std::vector<double>> data(3, std::vector<double>(5));
  std::vector<std::vector<char>> bytes(3, std::vector<char>(4, 'x'));
  bytes[1] = {'a', 'b', 'c', 'd'};
  OnEachNode(3, [&](int r) {
    for (int i = 0; i < 5; ++i) data[r][i] = r * 10 + i;
    for (int iter = 0; iter < 20; ++iter) {
      if (iter > 0) {
        for (int i = 0; i < 5; ++i) data[r][i] = r * 10 + i;
      }
      ASSERT_TRUE(
          nodes[r]->AllreduceSum(data[r].data(), 5, DType::kFloat64).ok());
    }
    ASSERT_TRUE(nodes[r]->Broadcast(bytes[r].data(), 4, 1).ok());
  });
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 5; ++i) EXPECT_EQ(data[r][i], 30 + 3 * i);
    EXPECT_EQ(std::string(bytes[r].begin(), bytes[r].end()), "abcd");
    EXPECT_EQ(nodes[r]->allreduce_calls(), 20);
    EXPECT_EQ(nodes[r]->allreduce_bytes(), 20 * 5 * 8);
  }
}

TEST(FakeCollectiveBackendTest, MismatchedCallsFailBothNodes) {
  auto nodes = FakeCollectiveBackend::CreateGroup(2, absl::Seconds(5));
  std::vector<absl::Status> status(2);
  OnEachNode(2, [&](int r) {
    std::vector<float> data(8, 1.0f);
    status[r] =
        nodes[r]->AllreduceSum(data.data(), r == 0 ? 8 : 4, DType::kFloat32);
  });
  for (const auto& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("mismatched collective"));
  }
}

TEST(FakeCollectiveBackendTest, LeavingNodeIsNamed) {
  auto nodes =
      FakeCollectiveBackend::CreateGroup(3, absl::Seconds(5), {"a", "b", "c"});
  nodes[2].reset();
  std::vector<absl::Status> status(2);
  OnEachNode(2, [&](int r) {
    float x = 1;
    status[r] = nodes[r]->AllreduceSum(&x, 1, DType::kFloat32);
  });
  for (const auto& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("'c'"));
  }
}

TEST(FakeCollectiveBackendTest, TimeoutNamesMissingNodeAndStaysBroken) {
  auto nodes = FakeCollectiveBackend::CreateGroup(2, absl::Milliseconds(200),
                                                  {"a", "b"});
  float x = 1;
  absl::Status s = nodes[0]->AllreduceSum(&x, 1, DType::kFloat32);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("'b'"));
  EXPECT_EQ(nodes[0]->AllreduceSum(&x, 1, DType::kFloat32).code(),
            absl::StatusCode::kDeadlineExceeded);
  // The late node does not touch the abandoned buffer; it gets an error.
  float y = 2;
  EXPECT_EQ(nodes[1]->AllreduceSum(&y, 1, DType::kFloat32).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(y, 2);
}

}  // namespace
}  // namespace gradd
