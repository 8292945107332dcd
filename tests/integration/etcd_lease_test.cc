// What a daemon's etcd lease and client tell about themselves (issue 34,
// operations), against a real etcd (Debian's etcd-server) started on
// loopback by the test: EtcdLease's events and Info() through a grant,
// keep-alives, etcd going away and coming back, the lease revoked behind
// its back and replaced, and its revocation; EtcdClient's call and
// endpoint-failure observers. What `graddctl status` and the gradd_etcd_*
// metrics show is built from exactly these.
#include "server/rendezvous/etcd/etcd_lease.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rendezvous/etcd/etcd_client.h"
#include "tests/integration/etcd_cluster.h"
#include "tests/unit/auth/test_certs.h"

namespace gradd {
namespace {

using ::gradd::testing::EtcdCluster;
using ::testing::HasSubstr;

// Every observer call of a lease and a client, in order.
class Recorder {
 public:
  void OnLease(EtcdLeaseEvent event, const EtcdLeaseInfo& info) {
    absl::MutexLock lock(&mu_);
    events_.emplace_back(event, info);
  }
  void OnCall(absl::string_view method, absl::StatusCode code) {
    absl::MutexLock lock(&mu_);
    ++calls_[absl::StrCat(method, " ", absl::StatusCodeToString(code))];
  }
  void OnEndpointFailure(absl::string_view endpoint) {
    absl::MutexLock lock(&mu_);
    ++endpoint_failures_[std::string(endpoint)];
  }

  // Waits until `event` is seen after the first `after` events; its info,
  // or nullopt (with a failure naming `what`) after `timeout`.
  std::optional<EtcdLeaseInfo> WaitFor(EtcdLeaseEvent event, size_t after,
                                       absl::Duration timeout,
                                       const std::string& what) {
    absl::MutexLock lock(&mu_);
    auto seen = [&] {
      for (size_t i = after; i < events_.size(); ++i) {
        if (events_[i].first == event) return true;
      }
      return false;
    };
    mu_.AwaitWithTimeout(absl::Condition(&seen), timeout);
    for (size_t i = after; i < events_.size(); ++i) {
      if (events_[i].first == event) return events_[i].second;
    }
    ADD_FAILURE() << "no '" << EtcdLeaseEventName(event) << "' event " << what
                  << " within " << absl::FormatDuration(timeout);
    return std::nullopt;
  }
  size_t NumEvents() {
    absl::MutexLock lock(&mu_);
    return events_.size();
  }
  std::pair<EtcdLeaseEvent, EtcdLeaseInfo> Last() {
    absl::MutexLock lock(&mu_);
    return events_.back();
  }
  int Calls(const std::string& method_and_code) {
    absl::MutexLock lock(&mu_);
    return calls_[method_and_code];
  }
  int EndpointFailures(const std::string& endpoint) {
    absl::MutexLock lock(&mu_);
    return endpoint_failures_[endpoint];
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<EtcdLeaseEvent, EtcdLeaseInfo>> events_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> endpoint_failures_ ABSL_GUARDED_BY(mu_);
};

class EtcdLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::gradd::testing::MakeTempDir("gradd-etcd-lease-");
    ASSERT_FALSE(dir_.empty());
    EtcdCluster::Options o;
    o.dir = dir_;
    cluster_ = EtcdCluster::Start(o);
    ASSERT_NE(cluster_, nullptr) << "etcd did not start (see above)";
  }
  void TearDown() override {
    cluster_.reset();
    ::gradd::testing::RemoveTree(dir_);
  }

  std::string dir_;
  std::unique_ptr<EtcdCluster> cluster_;
};

TEST_F(EtcdLeaseTest, TheLeaseSaysWhatHappensToIt) {
  Recorder recorder;
  EtcdClient::Options o = cluster_->ClientOptions();
  // Short bounds, so a keep-alive to a dead etcd gives up well within
  // the TTL.
  o.rpc_timeout = absl::Milliseconds(500);
  o.retry_timeout = absl::Seconds(1);
  o.on_call = [&](absl::string_view method, absl::StatusCode code) {
    recorder.OnCall(method, code);
  };
  o.on_endpoint_failure = [&](absl::string_view endpoint) {
    recorder.OnEndpointFailure(endpoint);
  };
  const std::string endpoint = o.endpoints[0];
  absl::StatusOr<std::unique_ptr<EtcdClient>> made = EtcdClient::Create(o);
  ASSERT_TRUE(made.ok()) << made.status();
  std::shared_ptr<EtcdClient> client = *std::move(made);

  const absl::Time before = absl::Now();
  absl::StatusOr<std::unique_ptr<EtcdLease>> created =
      EtcdLease::Create(client, absl::Seconds(2),
                        [&](EtcdLeaseEvent event, const EtcdLeaseInfo& info) {
                          recorder.OnLease(event, info);
                        });
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<EtcdLease> lease = *std::move(created);

  // Granted: told before Create returned.
  ASSERT_EQ(recorder.NumEvents(), 1u);
  EXPECT_EQ(recorder.Last().first, EtcdLeaseEvent::kGranted);
  EtcdLeaseInfo info = lease->Info();
  const int64_t first_id = info.id;
  EXPECT_NE(first_id, 0);
  EXPECT_EQ(first_id, lease->current_id());
  EXPECT_TRUE(info.held);
  EXPECT_EQ(info.ttl, absl::Seconds(2));
  EXPECT_GE(info.granted, before);
  EXPECT_EQ(info.grants, 1u);
  EXPECT_EQ(info.losses, 0u);
  EXPECT_EQ(info.lost_reason, "");
  EXPECT_EQ(recorder.Calls("LeaseGrant OK"), 1);

  // Kept alive every TTL/3.
  std::optional<EtcdLeaseInfo> kept = recorder.WaitFor(
      EtcdLeaseEvent::kKeptAlive, 1, absl::Seconds(10), "after the grant");
  ASSERT_TRUE(kept.has_value());
  EXPECT_TRUE(kept->held);
  EXPECT_GT(kept->last_kept_alive, info.granted);
  EXPECT_GE(recorder.Calls("LeaseKeepAlive OK"), 1);

  // etcd goes away: keep-alives fail, naming the endpoint; the lease stays
  // held until a TTL has passed without an answer (etcd keeps it that
  // long), then is not held -- but etcd has not said it is gone.
  size_t seen = recorder.NumEvents();
  cluster_->Kill(0);
  std::optional<EtcdLeaseInfo> failed =
      recorder.WaitFor(EtcdLeaseEvent::kKeepAliveFailed, seen,
                       absl::Seconds(15), "with etcd killed");
  ASSERT_TRUE(failed.has_value());
  EXPECT_GE(failed->failed_keepalives, 1u);
  EXPECT_THAT(failed->last_error, HasSubstr(endpoint));
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (lease->Info().held && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  info = lease->Info();
  EXPECT_FALSE(info.held);
  EXPECT_EQ(info.id, first_id);
  EXPECT_EQ(info.lost_reason, "");
  EXPECT_EQ(info.losses, 0u);
  EXPECT_GE(recorder.EndpointFailures(endpoint), 1);
  EXPECT_GE(recorder.Calls("LeaseKeepAlive UNAVAILABLE") +
                recorder.Calls("LeaseKeepAlive DEADLINE_EXCEEDED"),
            1);

  // etcd back: its leases are refreshed as it takes the lead, so the same
  // lease is kept alive again and held.
  seen = recorder.NumEvents();
  ASSERT_TRUE(cluster_->Restart(0));
  kept = recorder.WaitFor(EtcdLeaseEvent::kKeptAlive, seen, absl::Seconds(30),
                          "after etcd came back");
  ASSERT_TRUE(kept.has_value());
  EXPECT_TRUE(kept->held);
  EXPECT_EQ(kept->id, first_id);
  EXPECT_EQ(kept->failed_keepalives, 0u);
  EXPECT_EQ(kept->last_error, "");

  // Revoked behind its back (as when it expired during a partition): the
  // next keep-alive hears it is gone.
  seen = recorder.NumEvents();
  ASSERT_TRUE(client->LeaseRevoke(first_id).ok());
  std::optional<EtcdLeaseInfo> lost = recorder.WaitFor(
      EtcdLeaseEvent::kLost, seen, absl::Seconds(10), "after the revoke");
  ASSERT_TRUE(lost.has_value());
  EXPECT_FALSE(lost->held);
  EXPECT_EQ(lost->id, first_id);
  EXPECT_EQ(lost->losses, 1u);
  EXPECT_EQ(lost->lost_reason, "etcd said it expired");
  EXPECT_EQ(lease->current_id(), 0);

  // The next write asks for a lease: a new one, granted and held.
  seen = recorder.NumEvents();
  absl::StatusOr<int64_t> id = lease->Id();
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_NE(*id, first_id);
  std::optional<EtcdLeaseInfo> granted = recorder.WaitFor(
      EtcdLeaseEvent::kGranted, seen, absl::Seconds(1), "after Id()");
  ASSERT_TRUE(granted.has_value());
  EXPECT_EQ(granted->id, *id);
  EXPECT_TRUE(granted->held);
  EXPECT_EQ(granted->grants, 2u);
  EXPECT_EQ(granted->losses, 1u);
  EXPECT_EQ(granted->lost_reason, "");

  // A write refused under it as not found (MarkLost) counts as a loss too.
  seen = recorder.NumEvents();
  lease->MarkLost(*id);
  lost = recorder.WaitFor(EtcdLeaseEvent::kLost, seen, absl::Seconds(1),
                          "after MarkLost");
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(lost->losses, 2u);
  EXPECT_THAT(lost->lost_reason, HasSubstr("refused a write"));
  ASSERT_TRUE(lease->Id().ok());

  // Stopping revokes it: the last event, with no lease left.
  lease.reset();
  const auto [last_event, last_info] = recorder.Last();
  EXPECT_EQ(last_event, EtcdLeaseEvent::kRevoked);
  EXPECT_EQ(last_info.id, 0);
  EXPECT_FALSE(last_info.held);
  EXPECT_EQ(last_info.lost_reason, "revoked");
  EXPECT_GE(recorder.Calls("LeaseRevoke OK"), 2);
}

TEST(EtcdLeaseEventTest, NamesAreStable) {
  EXPECT_STREQ(EtcdLeaseEventName(EtcdLeaseEvent::kGranted), "granted");
  EXPECT_STREQ(EtcdLeaseEventName(EtcdLeaseEvent::kKeptAlive), "kept_alive");
  EXPECT_STREQ(EtcdLeaseEventName(EtcdLeaseEvent::kKeepAliveFailed),
               "keepalive_failed");
  EXPECT_STREQ(EtcdLeaseEventName(EtcdLeaseEvent::kLost), "lost");
  EXPECT_STREQ(EtcdLeaseEventName(EtcdLeaseEvent::kRevoked), "revoked");
}

}  // namespace
}  // namespace gradd
