// EtcdClient, EtcdLease and EtcdStore against a real etcd (Debian's
// etcd-server) started on loopback by the test (etcd_cluster.h): every
// RendezvousStoreInterface method, waits and timeouts, Add under
// concurrency, leases, failover in a 3-member cluster, mutual TLS, user and
// password, and strangers refused.
#include "server/rendezvous/etcd/etcd_store.h"

#include <atomic>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rendezvous/etcd/etcd_client.h"
#include "server/rendezvous/etcd/etcd_lease.h"
#include "tests/integration/etcd_cluster.h"
#include "tests/unit/auth/test_certs.h"

namespace gradd {
namespace {

using ::gradd::testing::EtcdCluster;
using ::testing::HasSubstr;

// A read's value, or its error as text (so that a failed read is shown
// in the comparison, not dereferenced).
std::string Text(const absl::StatusOr<std::string>& read) {
  return read.ok() ? *read
                   : absl::StrCat("<error: ", read.status().ToString(), ">");
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class EtcdStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::gradd::testing::MakeTempDir("gradd-etcd-");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    cluster_.reset();
    ::gradd::testing::RemoveTree(dir_);
    ::gradd::testing::RemoveTree(certs_);
  }
  // Fatal on failure: call it under ASSERT_NO_FATAL_FAILURE, so that a
  // test whose etcd did not come up stops there (with the cluster's
  // message) instead of going on with no cluster.
  void StartCluster(int members = 1, bool tls = false) {
    EtcdCluster::Options o;
    o.members = members;
    o.dir = dir_;
    o.tls = tls;
    if (tls) {
      certs_ = ::gradd::testing::MakeTestCerts();
      ASSERT_FALSE(certs_.empty()) << "no test certificates";
      o.certs_dir = certs_;
    }
    cluster_ = EtcdCluster::Start(o);
    ASSERT_NE(cluster_, nullptr) << "etcd did not start (see above)";
  }
  // The helpers below never return null: on a failure they end the test
  // with a clear message (see Fatal()).
  std::shared_ptr<EtcdClient> Client(EtcdClient::Options o) {
    absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Create(o);
    if (!c.ok())
      Fatal(absl::StrCat("EtcdClient::Create: ", c.status().ToString()));
    return std::shared_ptr<EtcdClient>(*std::move(c));
  }
  std::shared_ptr<EtcdClient> Client() {
    if (cluster_ == nullptr) Fatal("no etcd cluster (StartCluster failed)");
    return Client(cluster_->ClientOptions());
  }
  std::unique_ptr<EtcdStore> Store(std::shared_ptr<EtcdLease> lease = nullptr,
                                   EtcdStore::Options o = {}) {
    return std::make_unique<EtcdStore>(Client(), std::move(lease), o);
  }
  std::shared_ptr<EtcdLease> Lease(std::shared_ptr<EtcdClient> client,
                                   absl::Duration ttl) {
    absl::StatusOr<std::unique_ptr<EtcdLease>> lease =
        EtcdLease::Create(std::move(client), ttl);
    if (!lease.ok())
      Fatal(absl::StrCat("EtcdLease::Create: ", lease.status().ToString()));
    return *std::move(lease);
  }
  [[noreturn]] static void Fatal(const std::string& message) {
    // The failure names the cause; the exception ends the test body
    // (gtest catches and reports it, then runs TearDown) where a helper
    // that returns a value cannot return early.
    ADD_FAILURE() << message;
    throw std::runtime_error(message);
  }
  bool Exists(EtcdClient& client, const std::string& key) {
    etcdserverpb::RangeRequest r;
    r.set_key(key);
    absl::StatusOr<etcdserverpb::RangeResponse> got = client.Range(r);
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() && got->kvs_size() > 0;
  }

  std::string dir_;
  std::string certs_;
  std::unique_ptr<EtcdCluster> cluster_;
};

TEST_F(EtcdStoreTest, SetGetDeleteAndDescribe) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::unique_ptr<EtcdStore> store = Store();
  ASSERT_TRUE(store->Set("job", "k", std::string("v\0w", 3)).ok());
  absl::StatusOr<std::string> got = store->Get("job", "k", absl::Seconds(1));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::string("v\0w", 3));
  ASSERT_TRUE(store->Set("job", "k", "second").ok());
  EXPECT_EQ(Text(store->Get("job", "k", absl::ZeroDuration())), "second");
  EXPECT_EQ(store->Delete("job", "k").value_or(false), true);
  EXPECT_EQ(store->Delete("job", "k").value_or(true), false);
  EXPECT_THAT(store->Describe(),
              HasSubstr(absl::StrCat("etcd ", cluster_->endpoints()[0])));
  EXPECT_THAT(store->Describe(), HasSubstr("prefix /gradd/"));
  EXPECT_EQ(store->EtcdKey("job", "k"), "/gradd/jobs/job/k");
}

TEST_F(EtcdStoreTest, JobsAreIsolatedWhateverTheirIds) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::unique_ptr<EtcdStore> store = Store();
  ASSERT_TRUE(store->Set("a/b", "c", "1").ok());
  ASSERT_TRUE(store->Set("a", "b/c", "2").ok());
  EXPECT_EQ(Text(store->Get("a/b", "c", absl::ZeroDuration())), "1");
  EXPECT_EQ(Text(store->Get("a", "b/c", absl::ZeroDuration())), "2");
  ASSERT_TRUE(store->DeleteJob("a").ok());
  EXPECT_EQ(Text(store->Get("a/b", "c", absl::ZeroDuration())), "1");
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      store->Get("a", "b/c", absl::Milliseconds(50)).status()));
}

TEST_F(EtcdStoreTest, GetWaitsForALaterSetAndTimesOutNamingTheKey) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::unique_ptr<EtcdStore> reader = Store();
  std::unique_ptr<EtcdStore> writer = Store();
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(300));
    ASSERT_TRUE(writer->Set("job", "late", "here").ok());
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> got =
      reader->Get("job", "late", absl::Seconds(30));
  later.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "here");
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));

  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::string> missing =
      reader->Get("job", "never", absl::Milliseconds(400));
  EXPECT_TRUE(absl::IsDeadlineExceeded(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("'never'"));
  EXPECT_THAT(missing.status().message(), HasSubstr("job 'job'"));
  EXPECT_THAT(missing.status().message(), HasSubstr(cluster_->endpoints()[0]));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(400));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(20));
}

TEST_F(EtcdStoreTest, WaitForSeveralKeysAndTheMissingOnesNamed) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::unique_ptr<EtcdStore> store = Store();
  ASSERT_TRUE(store->Set("job", "a", "1").ok());
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(200));
    ASSERT_TRUE(store->Set("job", "b", "2").ok());
    absl::SleepFor(absl::Milliseconds(200));
    ASSERT_TRUE(store->Set("job", "c", "3").ok());
  });
  absl::Status waited = store->Wait("job", {"a", "b", "c"}, absl::Seconds(30));
  later.join();
  EXPECT_TRUE(waited.ok()) << waited;
  absl::Status timed_out =
      store->Wait("job", {"a", "x", "y"}, absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(timed_out)) << timed_out;
  EXPECT_THAT(timed_out.message(), HasSubstr("'x', 'y'"));
  EXPECT_THAT(timed_out.message(), ::testing::Not(HasSubstr("'a'")));
  // Longer than one watch stream: the wait reopens it and still sees the key.
  EtcdClient::Options o = cluster_->ClientOptions();
  o.max_watch_per_stream = absl::Milliseconds(200);
  EtcdStore short_streams(Client(o), nullptr, {});
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(700));
    ASSERT_TRUE(store->Set("job", "z", "1").ok());
  });
  EXPECT_TRUE(short_streams.Wait("job", {"z"}, absl::Seconds(30)).ok());
  late.join();
}

TEST_F(EtcdStoreTest, AddIsAtomicAcrossClients) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  constexpr int kThreads = 6;
  constexpr int kAdds = 40;
  std::vector<std::unique_ptr<EtcdStore>> stores;
  for (int i = 0; i < kThreads; ++i) stores.push_back(Store());
  absl::Mutex mu;
  std::set<int64_t> seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAdds; ++i) {
        absl::StatusOr<int64_t> v = stores[t]->Add("job", "counter", 1);
        ASSERT_TRUE(v.ok()) << v.status();
        absl::MutexLock lock(&mu);
        EXPECT_TRUE(seen.insert(*v).second) << "value " << *v << " twice";
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(seen.size(), kThreads * kAdds);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(*seen.rbegin(), kThreads * kAdds);
  EXPECT_EQ(Text(stores[0]->Get("job", "counter", absl::ZeroDuration())),
            absl::StrCat(kThreads * kAdds));
  EXPECT_EQ(stores[0]->Add("job", "counter", -kThreads * kAdds).value_or(-1),
            0);
  ASSERT_TRUE(stores[0]->Set("job", "text", "abc").ok());
  absl::StatusOr<int64_t> bad = stores[0]->Add("job", "text", 1);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  ASSERT_TRUE(stores[0]->Set("job", "big", "9223372036854775807").ok());
  EXPECT_TRUE(absl::IsOutOfRange(stores[0]->Add("job", "big", 1).status()));
}

TEST_F(EtcdStoreTest, LimitsAndBadArgumentsAsTheBuiltInStore) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  EtcdStore::Options o;
  o.max_key_bytes = 16;
  o.max_value_bytes = 4 << 20;
  std::unique_ptr<EtcdStore> store = Store(nullptr, o);
  EXPECT_TRUE(absl::IsInvalidArgument(store->Set("", "k", "v")));
  EXPECT_TRUE(absl::IsInvalidArgument(store->Set("job", "", "v")));
  absl::Status long_key = store->Set("job", std::string(17, 'k'), "v");
  EXPECT_TRUE(absl::IsInvalidArgument(long_key));
  EXPECT_THAT(long_key.message(), HasSubstr("rendezvous.limits.max_key_bytes"));
  absl::Status big = store->Set("job", "k", std::string((4 << 20) + 1, 'x'));
  EXPECT_TRUE(absl::IsResourceExhausted(big)) << big;
  // Within gradd's limit but over etcd's own request limit (1.5 MiB).
  absl::Status etcd_big = store->Set("job", "k", std::string(2 << 20, 'x'));
  EXPECT_TRUE(absl::IsResourceExhausted(etcd_big)) << etcd_big;
  EXPECT_TRUE(absl::IsInvalidArgument(
      store->Wait("job", {"ok", ""}, absl::Milliseconds(10))));
}

TEST_F(EtcdStoreTest, ReleaseDeletesARoundOnceEveryNodeReleasedIt) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::unique_ptr<EtcdStore> store = Store();
  ASSERT_TRUE(store->Set("job", "round1/member/a", "x").ok());
  ASSERT_TRUE(store->Set("job", "round1/closed", "formed").ok());
  ASSERT_TRUE(store->Set("job", "round10/member/a", "y").ok());
  ASSERT_TRUE(store->Set("job", "other", "z").ok());
  EXPECT_EQ(store->Release("job", "round1", "a", 2).value_or(true), false);
  EXPECT_EQ(store->Release("job", "round1", "a", 2).value_or(true), false);
  EXPECT_EQ(store->Release("job", "round1", "b", 2).value_or(false), true);
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      store->Get("job", "round1/member/a", absl::Milliseconds(50)).status()));
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      store->Get("job", "round1/released/a", absl::Milliseconds(50)).status()));
  EXPECT_EQ(Text(store->Get("job", "round1/closed", absl::ZeroDuration())),
            "formed");
  EXPECT_EQ(Text(store->Get("job", "round10/member/a", absl::ZeroDuration())),
            "y");
  EXPECT_EQ(Text(store->Get("job", "other", absl::ZeroDuration())), "z");
  EXPECT_EQ(store->Release("job", "round7", "a", 1).value_or(true), false);
  EXPECT_TRUE(absl::IsInvalidArgument(
      store->Release("job", "round/1", "a", 1).status()));
}

TEST_F(EtcdStoreTest, AJobThatEndedEverywhereLeavesNoKey) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::unique_ptr<EtcdStore> store = Store();
  // A read of a missing counter writes nothing.
  EXPECT_EQ(store->Add("job", "rounds/probe", 0).value_or(-1), 0);
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      store->Get("job", "rounds/probe", absl::ZeroDuration()).status()));
  ASSERT_TRUE(store->Add("job", "round1/joined", 2).ok());
  EXPECT_EQ(store->Add("job", "round1/joined", 0).value_or(-1), 2);
  ASSERT_TRUE(store->Set("job", "round1/member/a", "x").ok());
  ASSERT_TRUE(store->Set("job", "round1/closed", "formed").ok());
  ASSERT_TRUE(store->Set("other", "round1/closed", "formed").ok());
  EXPECT_EQ(store->Release("job", "round1", "a", 2).value_or(true), false);
  EXPECT_EQ(store->Release("job", "round1", "b", 2).value_or(false), true);
  // Its last round's "closed" mark went with it: nothing of the job is left
  // (another job's keys stay).
  EXPECT_EQ(store->DeletePrefix("job", "").value_or(-1), 0);
  EXPECT_EQ(store->CountPrefix("other", "round1/").value_or(-1), 1);
}

TEST_F(EtcdStoreTest, LeaseKeepsOwnKeysAliveAndRevokesThemOnClose) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::shared_ptr<EtcdClient> client = Client();
  absl::StatusOr<std::unique_ptr<EtcdLease>> lease =
      EtcdLease::Create(client, absl::Seconds(3));
  ASSERT_TRUE(lease.ok()) << lease.status();
  std::shared_ptr<EtcdLease> shared = *std::move(lease);
  auto store =
      std::make_unique<EtcdStore>(client, shared, EtcdStore::Options());
  EXPECT_TRUE(store->HasLeases());
  const std::string own = store->EtcdKey("job", "alive/a");
  const std::string k = store->EtcdKey("job", "k");
  const std::string n = store->EtcdKey("job", "n");
  ASSERT_TRUE(store->SetOwn("job", "alive/a", "a").ok());
  ASSERT_TRUE(store->Set("job", "k", "v").ok());
  ASSERT_TRUE(store->Add("job", "n", 1).ok());
  // Well past the TTL: the keeper keeps it.
  absl::SleepFor(absl::Seconds(7));
  EXPECT_TRUE(Exists(*client, own));
  EXPECT_GT(client->LeaseTimeToLive(shared->current_id()).value_or(-1), 0);
  // A daemon that stops cleanly (its stores and lease go) takes its own
  // keys with it; what the job's nodes share stays for the others.
  store.reset();
  shared.reset();
  EXPECT_FALSE(Exists(*client, own));
  EXPECT_TRUE(Exists(*client, k));
  EXPECT_TRUE(Exists(*client, n));
}

TEST_F(EtcdStoreTest, AVanishedWritersKeysGoWithItsLease) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::shared_ptr<EtcdClient> client = Client();
  // A lease nobody keeps alive: the daemon that held it is gone.
  absl::StatusOr<etcdserverpb::LeaseGrantResponse> granted =
      client->LeaseGrant(absl::Seconds(2));
  ASSERT_TRUE(granted.ok()) << granted.status();
  etcdserverpb::PutRequest put;
  put.set_key("/gradd/jobs/job/k");
  put.set_value("v");
  put.set_lease(granted->id());
  ASSERT_TRUE(client->Put(put).ok());
  EXPECT_TRUE(Exists(*client, "/gradd/jobs/job/k"));
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (Exists(*client, "/gradd/jobs/job/k") && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_FALSE(Exists(*client, "/gradd/jobs/job/k"));
}

TEST_F(EtcdStoreTest, ALostLeaseIsReplacedAtTheNextWrite) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::shared_ptr<EtcdClient> client = Client();
  std::shared_ptr<EtcdLease> lease = Lease(client, absl::Seconds(30));
  EtcdStore store(client, lease, {});
  ASSERT_TRUE(store.SetOwn("job", "before", "v").ok());
  const int64_t old_id = lease->current_id();
  // Revoked behind its back (as when it expired during a partition).
  ASSERT_TRUE(client->LeaseRevoke(old_id).ok());
  ASSERT_TRUE(store.SetOwn("job", "after", "v").ok());
  EXPECT_NE(lease->current_id(), old_id);
  EXPECT_TRUE(Exists(*client, store.EtcdKey("job", "after")));
  EXPECT_FALSE(Exists(*client, store.EtcdKey("job", "before")));
}

TEST_F(EtcdStoreTest, CompareAndSetIsOneTransaction) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::shared_ptr<EtcdClient> client = Client();
  EtcdStore store(client, Lease(client, absl::Seconds(30)), {});
  const std::pair<std::string, std::string> also[] = {{"epoch1/members", "m1"}};
  // Absent -> "1", with the verdict.
  EXPECT_EQ(store.CompareAndSet("job", "epoch", std::nullopt, "1", also)
                .value_or(false),
            true);
  EXPECT_EQ(Text(store.Get("job", "epoch1/members", absl::ZeroDuration())),
            "m1");
  // A second decider of the same epoch loses, and writes nothing.
  const std::pair<std::string, std::string> other[] = {
      {"epoch1/members", "m1-late"}};
  EXPECT_EQ(store.CompareAndSet("job", "epoch", std::nullopt, "1", other)
                .value_or(true),
            false);
  EXPECT_EQ(Text(store.Get("job", "epoch1/members", absl::ZeroDuration())),
            "m1");
  // "1" -> "2"; a stale expectation fails.
  EXPECT_EQ(store.CompareAndSet("job", "epoch", std::string("1"), "2", {})
                .value_or(false),
            true);
  EXPECT_EQ(store.CompareAndSet("job", "epoch", std::string("1"), "3", {})
                .value_or(true),
            false);
  EXPECT_EQ(Text(store.Get("job", "epoch", absl::ZeroDuration())), "2");
  // Shared keys carry no lease: they outlive the writer.
  EXPECT_TRUE(Exists(*client, store.EtcdKey("job", "epoch")));
  EXPECT_TRUE(absl::IsInvalidArgument(
      store.CompareAndSet("", "epoch", std::nullopt, "1", {}).status()));
}

TEST_F(EtcdStoreTest, DeleteAndCountByPrefix) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::shared_ptr<EtcdClient> client = Client();
  EtcdStore store(client, Lease(client, absl::Seconds(30)), {});
  for (const char* key : {"e1/a", "e1/b", "e1/c/d", "e10/a", "e2/a"}) {
    ASSERT_TRUE(store.Set("job", key, "v").ok());
  }
  ASSERT_TRUE(store.Set("other", "e1/a", "v").ok());
  EXPECT_EQ(store.CountPrefix("job", "e1/").value_or(-1), 3);
  EXPECT_EQ(store.DeletePrefix("job", "e1/").value_or(-1), 3);
  EXPECT_EQ(store.CountPrefix("job", "e1/").value_or(-1), 0);
  EXPECT_TRUE(Exists(*client, store.EtcdKey("job", "e10/a")));
  EXPECT_TRUE(Exists(*client, store.EtcdKey("other", "e1/a")));
  // The empty prefix: the whole job, and only it.
  EXPECT_EQ(store.DeletePrefix("job", "").value_or(-1), 2);
  EXPECT_TRUE(Exists(*client, store.EtcdKey("other", "e1/a")));
}

TEST_F(EtcdStoreTest, AMemberKilledChangesNothingForTheClient) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(3));
  std::shared_ptr<EtcdClient> client = Client();
  EtcdStore store(client, Lease(client, absl::Seconds(8)), {});
  ASSERT_TRUE(store.Set("job", "a", "1").ok());
  // A wait in progress when the member it watches on dies.
  std::thread waiter([&] {
    EXPECT_EQ(store.Get("job", "b", absl::Seconds(20)).value_or("error"), "2");
  });
  absl::SleepFor(absl::Milliseconds(300));
  cluster_->Kill(0);  // the first endpoint, the one the client uses
  EtcdStore other(Client(), nullptr, {});
  ASSERT_TRUE(other.Set("job", "b", "2").ok());
  waiter.join();
  EXPECT_EQ(Text(store.Get("job", "a", absl::Seconds(5))), "1");
  EXPECT_EQ(store.Add("job", "n", 5).value_or(-1), 5);
  absl::SleepFor(absl::Seconds(10));  // past the lease TTL: kept alive
  EXPECT_EQ(Text(store.Get("job", "a", absl::Seconds(5))), "1");
}

TEST_F(EtcdStoreTest, UnreachableEtcdIsUnavailableNamingTheEndpoints) {
  EtcdClient::Options o;
  o.endpoints = {"127.0.0.1:1", "127.0.0.1:2"};
  o.retry_timeout = absl::Milliseconds(500);
  EtcdStore store(Client(o), nullptr, {});
  absl::Status s = store.Set("job", "k", "v");
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("etcd 127.0.0.1:1,127.0.0.1:2"));
  EXPECT_TRUE(absl::IsInvalidArgument(
      EtcdClient::Create({.endpoints = {"no-port"}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(EtcdClient::Create({}).status()));
}

TEST_F(EtcdStoreTest, ACallTimeoutBoundsEveryCallWhenEtcdIsUnreachable) {
  // The client alone would try for 15 s; a formation's store gives up in
  // its call timeout (the formation timeout, CoordinatorSelector::Connect), and
  // says which etcd it could not reach.
  EtcdClient::Options o;
  o.endpoints = {"127.0.0.1:1", "127.0.0.1:2"};
  EtcdStore::Options so;
  so.call_timeout = absl::Seconds(1);
  EtcdStore store(Client(o), nullptr, so);
  for (int call = 0; call < 4; ++call) {
    const absl::Time start = absl::Now();
    absl::Status s;
    switch (call) {
      case 0:
        s = store.Set("job", "k", "v");
        break;
      case 1:
        s = store.Add("job", "n", 1).status();
        break;
      case 2:
        s = store.CompareAndSet("job", "e", std::nullopt, "1", {}).status();
        break;
      default:
        s = store.Get("job", "k", absl::Seconds(30)).status();
        break;
    }
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << call << ": " << s;
    EXPECT_FALSE(s.ok()) << call;
    EXPECT_THAT(s.message(), HasSubstr("etcd 127.0.0.1:1,127.0.0.1:2")) << call;
  }
}

TEST_F(EtcdStoreTest, MutualTlsAndStrangersRefused) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1, /*tls=*/true));
  std::unique_ptr<EtcdStore> store = Store();
  ASSERT_TRUE(store->Set("job", "secret", "gloo-key").ok());
  EXPECT_EQ(Text(store->Get("job", "secret", absl::ZeroDuration())),
            "gloo-key");
  EXPECT_EQ(Client()->SecurityDescription(), "mTLS");

  auto stranger_fails = [&](EtcdClient::Options o, const std::string& who) {
    o.retry_timeout = absl::Milliseconds(800);
    EtcdStore s(Client(o), nullptr, {});
    absl::StatusOr<std::string> read = s.Get("job", "secret", absl::Seconds(1));
    EXPECT_FALSE(read.ok()) << who << " read the secret";
    EXPECT_THAT(read.status().message(), HasSubstr(cluster_->endpoints()[0]))
        << who;
    EXPECT_FALSE(s.Set("job", "secret", "forged").ok()) << who;
  };
  EtcdClient::Options plaintext;
  plaintext.endpoints = cluster_->endpoints();
  stranger_fails(plaintext, "a plaintext client");
  EtcdClient::Options no_cert = cluster_->ClientOptions();
  no_cert.tls.cert_pem.clear();
  no_cert.tls.key_pem.clear();
  stranger_fails(no_cert, "a TLS client without a certificate");
  EtcdClient::Options other_ca = cluster_->ClientOptions();
  other_ca.tls.cert_pem = ReadText(certs_ + "/stranger.crt");
  other_ca.tls.key_pem = ReadText(certs_ + "/stranger.key");
  stranger_fails(other_ca, "a client with another CA's certificate");
  EXPECT_EQ(Text(store->Get("job", "secret", absl::ZeroDuration())),
            "gloo-key");
}

TEST_F(EtcdStoreTest, UserAndPasswordWithTokensAndStrangersRefused) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  // Authentication on, as `etcdctl user add root; etcdctl auth enable` do.
  ASSERT_TRUE(cluster_->EnableAuth("root", "s3cret-pw-for-test"));
  EtcdClient::Options o = cluster_->ClientOptions();
  o.user = "root";
  o.password = "s3cret-pw-for-test";
  std::shared_ptr<EtcdClient> client = Client(o);
  EXPECT_EQ(client->SecurityDescription(), "plaintext + user root");
  EtcdStore store(client, Lease(client, absl::Seconds(5)), {});
  ASSERT_TRUE(store.Set("job", "k", "v").ok());
  EXPECT_EQ(store.Add("job", "n", 3).value_or(-1), 3);
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(200));
    ASSERT_TRUE(store.Set("job", "late", "x").ok());
  });
  EXPECT_EQ(store.Get("job", "late", absl::Seconds(5)).value_or(""), "x");
  later.join();

  EtcdClient::Options nobody = cluster_->ClientOptions();
  nobody.retry_timeout = absl::Milliseconds(500);
  EtcdStore stranger(Client(nobody), nullptr, {});
  absl::StatusOr<std::string> read =
      stranger.Get("job", "k", absl::Milliseconds(200));
  EXPECT_FALSE(read.ok());
  EXPECT_FALSE(stranger.Set("job", "k", "forged").ok());
  EtcdClient::Options wrong = o;
  wrong.password = "not-the-password";
  EtcdStore wrong_pw(Client(wrong), nullptr, {});
  absl::Status refused = wrong_pw.Set("job", "k", "forged");
  EXPECT_TRUE(absl::IsUnauthenticated(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("user 'root'"));
  EXPECT_THAT(refused.message(), ::testing::Not(HasSubstr("not-the-password")));
  EXPECT_EQ(Text(store.Get("job", "k", absl::ZeroDuration())), "v");
}

}  // namespace
}  // namespace gradd
