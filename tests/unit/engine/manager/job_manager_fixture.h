// A JobManager driven through its handler interface (no gRPC) with a fake
// session registry, and AttachJob to attach and map a whole local job:
// shared by job_manager_test and rebuild_test.
#ifndef GRADD_TESTS_UNIT_ENGINE_MANAGER_JOB_MANAGER_FIXTURE_H_
#define GRADD_TESTS_UNIT_ENGINE_MANAGER_JOB_MANAGER_FIXTURE_H_

#include <memory>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config.h"
#include "server/engine/manager/job_manager.h"
#include "tests/unit/engine/manager/fake_session_registry.h"
#include "tests/unit/engine/manager/test_rank.h"

namespace gradd {

// A status with `code` whose message contains `substr`.
MATCHER_P2(StatusIs, code, substr, "") {
  if (arg.code() == code &&
      std::string(arg.message()).find(substr) != std::string::npos) {
    return true;
  }
  *result_listener << "status is " << arg;
  return false;
}

class JobManagerFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = DefaultConfig();
    config_.set_attach_timeout_ms(10000);
  }
  void TearDown() override {
    if (manager_) manager_->Stop();
  }

  // Created on first use, so a test can change config_ before.
  JobManager& manager() {
    if (!manager_) {
      manager_ = std::make_unique<JobManager>(config_, &sessions_, &pool_);
      sessions_.set_observer(manager_.get());
    }
    return *manager_;
  }

  // Attaches `world` ranks of `job` (each with its own session) and returns
  // them mapped; fails the test (and returns none) if any attach fails.
  std::vector<std::unique_ptr<TestRank>> AttachJob(
      const std::string& job, int world, const std::vector<TestParam>& params,
      double bucket_cap_mb = 0, double first_cap_mb = 0,
      uint64_t broadcast_bytes = 0) {
    std::vector<uint64_t> session(world);
    std::vector<std::shared_ptr<PendingAttach>> pending;
    for (int r = 0; r < world; ++r) {
      session[r] = sessions_.Open();
      v1::AttachRequest req = MakeRequest(job, r, world, session[r], params);
      req.set_bucket_cap_mb(bucket_cap_mb);
      req.set_first_bucket_cap_mb(first_cap_mb);
      req.set_broadcast_bytes(broadcast_bytes);
      req.set_follows_plan_switches(follow_plan_switches_);
      pending.push_back(StartAttach(manager(), std::move(req)));
    }
    std::vector<std::unique_ptr<TestRank>> ranks;
    for (int r = 0; r < world; ++r) {
      absl::StatusOr<v1::AttachResponse> resp = pending[r]->Get();
      EXPECT_TRUE(resp.ok()) << resp.status();
      if (!resp.ok()) return {};
      FakeSessionRegistry::Sent sent = sessions_.TakeSent(session[r]);
      EXPECT_EQ(sent.attach_id, resp->attach_id());
      EXPECT_EQ(sent.fds.size(), 4u);  // job block, memory, rank block, bell
      ranks.push_back(
          std::make_unique<TestRank>(r, session[r], *resp, std::move(sent)));
    }
    return ranks;
  }

  v1::DaemonConfig config_;
  // AttachRequest.follows_plan_switches of every rank AttachJob attaches.
  bool follow_plan_switches_ = false;
  ThreadPool pool_{2};
  FakeSessionRegistry sessions_;
  std::unique_ptr<JobManager> manager_;
};

}  // namespace gradd

#endif  // GRADD_TESTS_UNIT_ENGINE_MANAGER_JOB_MANAGER_FIXTURE_H_
