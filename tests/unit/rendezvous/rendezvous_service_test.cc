// The store's semantics through the real gRPC service on 127.0.0.1:0.
#include "server/rendezvous/rendezvous_service.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rendezvous/kv_store.h"
#include "server/rendezvous/rendezvous_client.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

class RendezvousServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RendezvousServer::Options options;
    options.listen_address = "127.0.0.1:0";
    // Short server-side cap so the client's re-wait loop is exercised.
    options.max_blocking_wait = absl::Milliseconds(300);
    auto server = RendezvousServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = MakeClient(server_->address());
  }

  static std::unique_ptr<RendezvousClient> MakeClient(
      const std::string& address,
      absl::Duration connect_timeout = absl::Seconds(10)) {
    RendezvousClient::Options options;
    options.address = address;
    options.connect_timeout = connect_timeout;
    options.rpc_timeout = absl::Seconds(5);
    auto client = RendezvousClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

  std::unique_ptr<RendezvousServer> server_;
  std::unique_ptr<RendezvousClient> client_;
};

TEST_F(RendezvousServiceTest, ReportsBoundPort) {
  EXPECT_GT(server_->port(), 0);
  EXPECT_EQ(server_->address(), "127.0.0.1:" + std::to_string(server_->port()));
}

TEST_F(RendezvousServiceTest, SetThenGetReturnsValueWithBinaryBytes) {
  const std::string value("a\0b\xff", 4);
  ASSERT_TRUE(client_->Set("job", "k", value).ok());
  auto got = client_->Get("job", "k", absl::Seconds(1));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, value);
  // Overwrite.
  ASSERT_TRUE(client_->Set("job", "k", "v2").ok());
  EXPECT_EQ(*client_->Get("job", "k", absl::Seconds(1)), "v2");
}

TEST_F(RendezvousServiceTest, BlockingGetIsSatisfiedByLaterSet) {
  absl::StatusOr<std::string> got;
  absl::Notification started;
  std::thread getter([&] {
    auto reader = MakeClient(server_->address());
    started.Notify();
    // Longer than the server's 300 ms cap: the client must wait again.
    got = reader->Get("job", "late", absl::Seconds(10));
  });
  started.WaitForNotification();
  absl::SleepFor(absl::Milliseconds(700));
  const absl::Time set_at = absl::Now();
  ASSERT_TRUE(client_->Set("job", "late", "here").ok());
  getter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "here");
  // Woken by the Set, not by a timeout.
  EXPECT_LT(absl::Now() - set_at, absl::Seconds(2));
}

TEST_F(RendezvousServiceTest, GetTimesOutWithDeadlineExceeded) {
  const absl::Time start = absl::Now();
  auto got = client_->Get("job", "never", absl::Milliseconds(500));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded)
      << got.status();
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr(server_->address()));
  EXPECT_GE(took, absl::Milliseconds(450));
  EXPECT_LT(took, absl::Seconds(3));
}

TEST_F(RendezvousServiceTest, AddIsAtomicUnderConcurrency) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 50;
  std::vector<std::thread> threads;
  std::vector<std::vector<int64_t>> seen(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        auto v = client_->Add("job", "counter", 1);
        ASSERT_TRUE(v.ok()) << v.status();
        seen[t].push_back(*v);
      }
    });
  }
  for (auto& t : threads) t.join();
  // Every returned value is distinct and they cover 1..N exactly.
  std::vector<int64_t> all;
  for (const auto& s : seen) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), size_t{kThreads * kPerThread});
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], int64_t(i + 1));
  EXPECT_EQ(*client_->Get("job", "counter", absl::Seconds(1)),
            std::to_string(kThreads * kPerThread));
  EXPECT_EQ(*client_->Add("job", "counter", -400), 0);
}

TEST_F(RendezvousServiceTest, AddOnNonCounterIsInvalidArgument) {
  ASSERT_TRUE(client_->Set("job", "text", "abc").ok());
  EXPECT_EQ(client_->Add("job", "text", 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RendezvousServiceTest, WaitForSeveralKeys) {
  absl::Status waited = absl::UnknownError("not run");
  std::thread waiter([&] {
    auto other = MakeClient(server_->address());
    waited = other->Wait("job", {"a", "b", "c"}, absl::Seconds(10));
  });
  ASSERT_TRUE(client_->Set("job", "a", "1").ok());
  ASSERT_TRUE(client_->Set("job", "b", "2").ok());
  absl::SleepFor(absl::Milliseconds(400));
  ASSERT_TRUE(client_->Set("job", "c", "3").ok());
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;
}

TEST_F(RendezvousServiceTest, WaitTimeoutNamesMissingKeys) {
  ASSERT_TRUE(client_->Set("job", "present", "1").ok());
  absl::Status s =
      client_->Wait("job", {"present", "absent"}, absl::Milliseconds(400));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("'absent'"));
  EXPECT_THAT(std::string(s.message()), ::testing::Not(HasSubstr("'present'")));
}

TEST_F(RendezvousServiceTest, DeleteRemovesKey) {
  ASSERT_TRUE(client_->Set("job", "k", "v").ok());
  EXPECT_TRUE(*client_->Delete("job", "k"));
  EXPECT_FALSE(*client_->Delete("job", "k"));
  EXPECT_EQ(client_->Get("job", "k", absl::Milliseconds(100)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(RendezvousServiceTest, JobsAreIsolated) {
  ASSERT_TRUE(client_->Set("job-a", "k", "a").ok());
  ASSERT_TRUE(client_->Set("job-b", "k", "b").ok());
  EXPECT_EQ(*client_->Get("job-a", "k", absl::Seconds(1)), "a");
  EXPECT_EQ(*client_->Get("job-b", "k", absl::Seconds(1)), "b");
  EXPECT_EQ(client_->Get("job-c", "k", absl::Milliseconds(100)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(*client_->Add("job-a", "n", 5), 5);
  EXPECT_EQ(*client_->Add("job-b", "n", 1), 1);
  EXPECT_TRUE(*client_->Delete("job-a", "k"));
  EXPECT_EQ(*client_->Get("job-b", "k", absl::Seconds(1)), "b");
  EXPECT_EQ(server_->store().NumKeys("job-a"), 1u);
}

TEST_F(RendezvousServiceTest, EmptyJobOrKeyIsInvalidArgument) {
  EXPECT_EQ(client_->Set("", "k", "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Set("job", "", "v").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RendezvousServiceTest, ShutdownWakesBlockedGet) {
  absl::StatusOr<std::string> got;
  std::thread getter([&] {
    auto reader = MakeClient(server_->address(), absl::Milliseconds(200));
    got = reader->Get("job", "never", absl::Seconds(3));
  });
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time start = absl::Now();
  server_->Shutdown();
  getter.join();
  // The client keeps retrying the gone coordinator until its own timeout.
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable)
      << got.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

// A loopback address nothing listens on: a server takes an OS-chosen port
// and stops again, freeing it. Empty if the server could not start.
std::string FreeLoopbackAddress() {
  auto probe = RendezvousServer::Start("127.0.0.1:0");
  if (!probe.ok()) return "";
  return "127.0.0.1:" + std::to_string((*probe)->port());
}

TEST(RendezvousClientTest, RetriesUntilLateServerStarts) {
  const std::string address = FreeLoopbackAddress();
  ASSERT_FALSE(address.empty());
  RendezvousClient::Options options;
  options.address = address;
  options.connect_timeout = absl::Seconds(10);
  auto client = RendezvousClient::Create(options);
  ASSERT_TRUE(client.ok());

  std::unique_ptr<RendezvousServer> server;
  std::thread starter([&] {
    absl::SleepFor(absl::Milliseconds(800));
    auto started = RendezvousServer::Start(address);
    ASSERT_TRUE(started.ok()) << started.status();
    server = *std::move(started);
  });
  const absl::Time start = absl::Now();
  absl::Status set = (*client)->Set("job", "k", "v");
  starter.join();
  EXPECT_TRUE(set.ok()) << set;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(700));
  EXPECT_EQ(*(*client)->Get("job", "k", absl::Seconds(1)), "v");
}

TEST(RendezvousClientTest, UnreachableCoordinatorErrorNamesAddress) {
  const std::string address = FreeLoopbackAddress();
  ASSERT_FALSE(address.empty());
  RendezvousClient::Options options;
  options.address = address;
  options.connect_timeout = absl::Milliseconds(500);
  auto client = RendezvousClient::Create(options);
  ASSERT_TRUE(client.ok());
  const absl::Time start = absl::Now();
  absl::Status s = (*client)->Set("job", "k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(address));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(RendezvousServerTest, BadAddressIsInvalidArgument) {
  EXPECT_EQ(RendezvousServer::Start("no-port").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvStoreTest, WaiterCapGivesResourceExhausted) {
  KvStore::Options options;
  options.max_waiters = 1;
  KvStore store(options);
  std::thread blocked([&] {
    EXPECT_EQ(store.Get("job", "x", absl::Seconds(5)).value_or(""), "go");
  });
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(store.Get("job", "y", absl::Seconds(1)).status().code(),
            absl::StatusCode::kResourceExhausted);
  // A key that already exists does not count as a waiter.
  ASSERT_TRUE(store.Set("job", "z", "1").ok());
  EXPECT_TRUE(store.Get("job", "z", absl::Seconds(1)).ok());
  ASSERT_TRUE(store.Set("job", "x", "go").ok());
  blocked.join();
}

}  // namespace
}  // namespace gradd
