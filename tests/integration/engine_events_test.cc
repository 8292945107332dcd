// The engine's event stream seen through the daemon's C++ API (what the
// admin service serves to `graddctl trace` and `graddctl stalls`): an
// in-process gradd with real trainer processes. The timeline of a running
// job has every rank's hand-over and the node's phases and turns into Chrome
// trace JSON; a rank that stops handing a bucket over shows up in
// JobManager::Stalls naming it.
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "server/admin/job_manager_source.h"
#include "server/config.h"
#include "server/daemon.h"
#include "tests/integration/harness.h"
#include "tests/support/temp_dir.h"
#include "tools/graddctl/trace.h"

namespace gradd::testing {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// The daemon runs in this process (its C++ API is what is tested); the
// trainers are processes of their own.
class InProcessDaemonTest : public GraddTest {
 protected:
  void SetUp() override {
    dir_ = ::gradd::testing::MakeTempDir("gradd-tl-");
    ASSERT_FALSE(dir_.empty());
    socket_ = dir_ + "/run/gradd.sock";
  }
  void TearDown() override {
    GraddTest::TearDown();  // kills the trainers first
    daemon_obj_.reset();
  }

  bool Start(v1::DaemonConfig config) {
    config.set_socket_path(socket_);
    absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Create(config);
    if (!d.ok()) {
      ADD_FAILURE() << d.status();
      return false;
    }
    daemon_obj_ = *std::move(d);
    return true;
  }

  // Polls fn() (bounded) until it returns true.
  template <typename Fn>
  bool Eventually(Fn fn, milliseconds timeout = milliseconds(30000)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (fn()) return true;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }

  std::unique_ptr<Daemon> daemon_obj_;
};

TEST_F(InProcessDaemonTest, TimelineOfARunningJobBecomesAChromeTrace) {
  v1::DaemonConfig config = DefaultConfig();
  config.set_stall_warning_ms(0);  // the hang below is on purpose
  ASSERT_TRUE(Start(config));
  const std::string job = "traced";
  // Three full iterations, then both ranks hang in iteration 4 with half
  // their gradients handed over, so the job stays active.
  std::vector<Proc> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(SpawnTrainer(job, r, 2,
                                 {"--iterations", "100", "--mode", "stall",
                                  "--stall-at", "4", "--seed", "3"}));
  }
  for (const Proc& p : ranks) {
    ASSERT_TRUE(WaitForText(p, "STALLED iteration=4", milliseconds(30000)))
        << ReadFile(p.log);
  }
  absl::StatusOr<std::vector<TimelineEvent>> events =
      daemon_obj_->job_manager().Timeline(job);
  ASSERT_TRUE(events.ok()) << events.status();

  // Every bucket of iterations 1..3: both ranks' hand-over, the local
  // reduce (single node: one fused pass) and done, in time order per
  // bucket.
  std::map<std::pair<uint64_t, int>, std::vector<std::string>> by_bucket;
  for (const TimelineEvent& e : *events) {
    by_bucket[{e.iteration, e.bucket}].push_back(
        absl::StrCat(e.phase, "@", e.local_rank));
    EXPECT_GT(e.start_unix_ns, 1'600'000'000'000'000'000);  // after 2020
    EXPECT_GE(e.duration_ns, 0);
  }
  std::set<int> buckets;
  for (const auto& [key, phases] : by_bucket) {
    if (key.first > 3) continue;
    buckets.insert(key.second);
    EXPECT_THAT(phases,
                ElementsAre("ready@0", "ready@1", "local_reduce@-1", "done@-1"))
        << "iteration " << key.first << " bucket " << key.second;
  }
  ASSERT_FALSE(buckets.empty());
  for (uint64_t it = 1; it <= 3; ++it) {
    for (int b : buckets) EXPECT_TRUE(by_bucket.count({it, b})) << it << b;
  }

  // What `graddctl trace` writes of them (through the admin API's form).
  v1::GetTraceResponse response;
  response.set_job_id(job);
  for (const TimelineEvent& e : *events) {
    *response.add_events() = ToTraceEvent(e);
  }
  const std::string json = ctl::ChromeTraceJson(response);
  google::protobuf::Struct trace;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &trace).ok())
      << json.substr(0, 2000);
  int complete = 0;
  std::set<double> tids;
  for (const auto& v : trace.fields().at("traceEvents").list_value().values()) {
    const auto& f = v.struct_value().fields();
    if (f.at("ph").string_value() != "X") continue;
    ++complete;
    tids.insert(f.at("tid").number_value());
  }
  EXPECT_EQ(complete, static_cast<int>(events->size()));
  EXPECT_THAT(tids, ElementsAre(0, 1, 2));  // the node, local ranks 0 and 1

  // An unknown job is named.
  absl::StatusOr<std::vector<TimelineEvent>> none =
      daemon_obj_->job_manager().Timeline("no-such-job");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("'no-such-job'"));
}

TEST_F(InProcessDaemonTest, StallsNameTheRankThatStoppedHandingOver) {
  v1::DaemonConfig config = DefaultConfig();
  config.set_stall_warning_ms(200);
  ASSERT_TRUE(Start(config));
  const std::string job = "stalled";
  // Rank 0 runs on; rank 1 hands over half of iteration 3 and hangs.
  std::vector<Proc> ranks;
  ranks.push_back(
      SpawnTrainer(job, 0, 2, {"--iterations", "5", "--seed", "5"}));
  ranks.push_back(SpawnTrainer(job, 1, 2,
                               {"--iterations", "5", "--mode", "stall",
                                "--stall-at", "3", "--seed", "5"}));
  ASSERT_TRUE(WaitForText(ranks[1], "STALLED iteration=3", milliseconds(30000)))
      << ReadFile(ranks[1].log);
  std::vector<StallReport> stalls;
  ASSERT_TRUE(Eventually([&] {
    absl::StatusOr<std::vector<StallReport>> s =
        daemon_obj_->job_manager().Stalls(job);
    if (!s.ok()) return false;
    stalls = *std::move(s);
    return !stalls.empty();
  })) << "no stall reported";
  for (const StallReport& r : stalls) {
    EXPECT_EQ(r.job_id, job);
    EXPECT_EQ(r.iteration, 3u);
    EXPECT_GE(r.waited_seconds, 0.2);
    EXPECT_THAT(r.missing_local_ranks, ElementsAre(1));
    EXPECT_THAT(r.missing_nodes, IsEmpty());
    EXPECT_THAT(r.unready_parameters, Not(IsEmpty()));
    EXPECT_THAT(r.message, HasSubstr("local rank 1 has not handed it over"));
  }
  const std::string metrics = daemon_obj_->metrics().Serialize();
  EXPECT_THAT(metrics, Not(HasSubstr("gradd_stalls_total 0")));
  EXPECT_THAT(metrics, HasSubstr("gradd_stalls_total "));
}

TEST_F(InProcessDaemonTest, MetricsAddressIsCheckedAtStart) {
  v1::DaemonConfig config = DefaultConfig();
  config.set_socket_path(socket_);
  config.mutable_metrics()->set_listen_address("127.0.0.1:0");
  absl::StatusOr<std::unique_ptr<Daemon>> first = Daemon::Create(config);
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->metrics_port();
  EXPECT_GT(port, 0);
  // Taken: a second daemon cannot serve there, and says where.
  v1::DaemonConfig taken = config;
  taken.set_socket_path(dir_ + "/run2/gradd.sock");
  taken.mutable_metrics()->set_listen_address(absl::StrCat("127.0.0.1:", port));
  absl::StatusOr<std::unique_ptr<Daemon>> second = Daemon::Create(taken);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("metrics.listen_address: cannot serve "
                                     "/metrics on 127.0.0.1:",
                                     port)));
  // Malformed: a config error before anything is bound.
  taken.mutable_metrics()->set_listen_address("127.0.0.1");
  second = Daemon::Create(taken);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(second.status().message(), HasSubstr("metrics.listen_address"));
}

}  // namespace
}  // namespace gradd::testing
