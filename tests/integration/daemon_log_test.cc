// The daemon's log as an operator reads it: a real gradd, real trainers,
// and its stderr. Every attach, detach, job formation and job failure is
// there with its reason, each line stamped (UTC) with its level; the level
// comes from --log-level or the config's log_level.
#include <signal.h>
#include <stdlib.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace gradd::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class DaemonLogTest : public GraddTest {
 protected:
  // A good 2-rank job, an attach refused for a bad rank, and a job that
  // fails when one of its ranks is killed mid-iteration; then the daemon
  // stops. Returns its log.
  std::string RunEventsAndStop() {
    std::vector<Exit> ok =
        RunJob("good", 2, {"--iterations", "3"}, milliseconds(20000));
    for (const Exit& e : ok) EXPECT_EQ(e.code, 0) << e.output;

    Proc bad = SpawnTrainer("badrank", 2, 2);
    EXPECT_NE(Wait(bad, milliseconds(20000)).code, 0);

    Proc stuck = SpawnTrainer(
        "dies", 0, 2,
        {"--mode", "stall", "--stall-at", "2", "--iterations", "5"});
    Proc other = SpawnTrainer("dies", 1, 2, {"--iterations", "5"});
    EXPECT_TRUE(WaitForText(stuck, "STALLED", milliseconds(20000)))
        << ReadFile(stuck.log);
    kill(stuck.pid, SIGKILL);
    Wait(stuck, milliseconds(10000));
    Exit e = Wait(other, milliseconds(20000));
    EXPECT_NE(e.code, 0) << e.output;

    EXPECT_EQ(StopDaemon(), 0);
    return ReadFile(daemon_.log);
  }

  static std::vector<std::string> Lines(const std::string& log) {
    return absl::StrSplit(log, '\n', absl::SkipEmpty());
  }
};

// "2026-12-01T11:30:00.123456Z I gradd: ..."
const std::regex kLinePattern(
    R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z [TDIWEC] gradd: .+)");

TEST_F(DaemonLogTest, EveryAttachDetachFormationAndFailureWithItsReason) {
  const std::string log = RunEventsAndStop();
  for (const std::string& line : Lines(log)) {
    EXPECT_TRUE(std::regex_match(line, kLinePattern)) << line;
  }
  EXPECT_THAT(log, HasSubstr("I gradd: job 'good' formed: 2 local ranks"));
  for (const char* rank : {"0", "1"}) {
    EXPECT_THAT(log, HasSubstr(std::string("I gradd: job 'good': local rank ") +
                               rank + " (session "));
    EXPECT_THAT(log, HasSubstr(std::string("I gradd: job 'good': local rank ") +
                               rank + " detached"));
  }
  EXPECT_THAT(log, HasSubstr("W gradd: job 'badrank': attach of local rank 2"));
  EXPECT_THAT(log, HasSubstr("failed: INVALID_ARGUMENT: job 'badrank': local "
                             "rank 2 is out of range for local world size 2"));
  // The killed rank: its session closing, and the job's failure naming it.
  EXPECT_THAT(log, HasSubstr("job 'dies': local rank 0 closed its session "
                             "without detaching"));
  EXPECT_TRUE(std::regex_search(
      log, std::regex(R"(E gradd: job 'dies' failed: \w+: .*local rank 0)")))
      << log;
  EXPECT_THAT(log, HasSubstr("I gradd: SIGTERM, shutting down"));
}

class WarningLevelTest : public DaemonLogTest {
 protected:
  void SetUp() override {
    daemon_flags_ = {"--log-level=warning"};
    DaemonLogTest::SetUp();
  }
};

TEST_F(WarningLevelTest, HidesInfoLinesKeepsWarningsAndErrors) {
  const std::string log = RunEventsAndStop();
  EXPECT_THAT(log, Not(HasSubstr(" I gradd: ")));
  EXPECT_THAT(log, HasSubstr("W gradd: job 'badrank': attach of local rank 2"));
  EXPECT_THAT(log, HasSubstr("E gradd: job 'dies' failed:"));
}

// log_level in the config file; --log-level overrides it.
class ConfigLevelTest : public DaemonLogTest {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gradd-logcfg-XXXXXX";
    const int fd = mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    close(fd);
    config_ = tmpl;
    std::ofstream(config_) << "log_level: error\n";
    daemon_flags_ = {"--config", config_};
    if (std::string(
            ::testing::UnitTest::GetInstance()->current_test_info()->name()) ==
        "FlagOverridesConfig") {
      daemon_flags_.push_back("--log-level=info");
    }
    DaemonLogTest::SetUp();
  }
  void TearDown() override {
    DaemonLogTest::TearDown();
    unlink(config_.c_str());
  }
  std::string config_;
};

TEST_F(ConfigLevelTest, ConfigLevelApplies) {
  const std::string log = RunEventsAndStop();
  EXPECT_THAT(log, Not(HasSubstr(" I gradd: ")));
  EXPECT_THAT(log, Not(HasSubstr(" W gradd: ")));
  EXPECT_THAT(log, HasSubstr("E gradd: job 'dies' failed:"));
}

TEST_F(ConfigLevelTest, FlagOverridesConfig) {
  const std::string log = RunEventsAndStop();
  EXPECT_THAT(log, HasSubstr("I gradd: job 'good' formed"));
}

}  // namespace
}  // namespace gradd::testing
