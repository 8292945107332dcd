// Rank restart (issue 23) with real processes: a real gradd and the C++
// example trainer in its restart-safe training mode (examples/cpp/
// trainer.cc, --mode train): deterministic data per (rank, step), the state
// sync before each step, an aborted iteration retried with the same batch.
//
// A trainer is SIGKILLed in the middle of a step's backward (it handed over
// part of its gradients, --pause-at-step) and started again with the same
// job id, rank and model:
//   - within the grace: every trainer finishes; the restarted one's
//     parameters after the state sync equal the others'; the survivor saw
//     exactly one aborted iteration, which it retried with the same batch
//     (no update applied, by anyone), so the final parameters equal those
//     of an uninterrupted run of the same steps (equal checksums of the
//     parameters' bytes: no step lost, none applied twice);
//   - not back within the grace: the job fails, the error names the rank;
//   - grace 0: today's behaviour, the job fails at once with ABORTED (not an
//     aborted iteration).
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace gradd::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr milliseconds kTimeout{60000};
constexpr char kSteps[] = "8";
constexpr char kParams[] = "3000000";  // 2 buckets: one handed over at the kill
constexpr int kPauseStep = 3;

// The lines of `output` containing `tag`.
std::vector<std::string> Lines(const std::string& output,
                               const std::string& tag) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (line.find(tag) != absl::string_view::npos) out.emplace_back(line);
  }
  return out;
}

// "key=value" of the trainer's FINAL line ("" if none).
std::string Final(const std::string& output, const std::string& key) {
  const std::vector<std::string> lines = Lines(output, "FINAL");
  return lines.empty() ? "" : ReportedValue(lines.back(), key);
}

class RankRestartTest : public GraddTest {
 protected:
  // The common flags of a training trainer with `grace_ms`, plus `extra`.
  static std::vector<std::string> Train(const std::string& grace_ms,
                                        std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = {"--mode",
                                      "train",
                                      "--iterations",
                                      kSteps,
                                      "--params",
                                      kParams,
                                      "--rank-restart-grace-ms",
                                      grace_ms};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return flags;
  }
  Proc StartTrainer(const std::string& name, const std::string& job, int rank,
                    const std::vector<std::string>& flags) {
    return SpawnTrainerBinary(GRADD_EXAMPLE_TRAINER, socket_, name, job, rank,
                              2, flags);
  }
  // Rank 0 and a rank 1 that stops in the middle of step kPauseStep's
  // backward; returns once rank 1 is stopped there (SIGKILLed).
  void StartAndKillRank1(const std::string& job, const std::string& grace_ms,
                         Proc* r0) {
    *r0 = StartTrainer(job + ".rank0", job, 0, Train(grace_ms));
    Proc r1 = StartTrainer(
        job + ".rank1", job, 1,
        Train(grace_ms, {"--pause-at-step", absl::StrCat(kPauseStep)}));
    ASSERT_TRUE(WaitForText(r1, "PAUSED", kTimeout)) << ReadFile(r1.log);
    ASSERT_EQ(kill(r1.pid, SIGKILL), 0);
    Exit killed = Wait(r1, milliseconds(5000));
    ASSERT_EQ(killed.code, 128 + SIGKILL) << killed.output;
  }
};

TEST_F(RankRestartTest, KilledTrainerRestartedWithinTheGraceRejoins) {
  // The reference: the same steps, nobody killed.
  std::vector<Proc> ref = {StartTrainer("ref.rank0", "ref", 0, Train("20000")),
                           StartTrainer("ref.rank1", "ref", 1, Train("20000"))};
  std::vector<Exit> ref_exits = WaitAll(ref, kTimeout);
  ASSERT_EQ(ref_exits[0].code, 0) << ref_exits[0].output;
  ASSERT_EQ(ref_exits[1].code, 0) << ref_exits[1].output;
  const std::string reference = Final(ref_exits[0].output, "checksum");
  ASSERT_FALSE(reference.empty()) << ref_exits[0].output;
  EXPECT_EQ(Final(ref_exits[1].output, "checksum"), reference);
  EXPECT_EQ(Final(ref_exits[0].output, "aborted"), "0");

  Proc r0;
  StartAndKillRank1("rs", "20000", &r0);
  // The new process: same job id, rank and model, no pause.
  Proc again = StartTrainer("rs.rank1.again", "rs", 1, Train("20000"));
  Exit e0 = Wait(r0, kTimeout);
  Exit e1 = Wait(again, kTimeout);
  ASSERT_EQ(e0.code, 0) << e0.output;
  ASSERT_EQ(e1.code, 0) << e1.output;

  // The survivor's iteration was aborted (once), naming the restarted rank,
  // and it retried the same step.
  const std::vector<std::string> aborted = Lines(e0.output, "ABORTED step=");
  ASSERT_EQ(aborted.size(), 1u) << e0.output;
  EXPECT_THAT(aborted[0], HasSubstr(absl::StrCat("step=", kPauseStep)));
  EXPECT_THAT(aborted[0], HasSubstr("local rank 1"));
  EXPECT_THAT(aborted[0], HasSubstr("job 'rs'"));
  EXPECT_THAT(aborted[0], HasSubstr("skip the optimizer step and retry the "
                                    "batch; the job goes on"));
  EXPECT_EQ(Final(e0.output, "aborted"), "1");
  EXPECT_EQ(Final(e0.output, "restarts"), "1");

  // The restarted trainer rejoined and resumed at the synced step, with the
  // survivor's parameters.
  EXPECT_EQ(Final(e1.output, "rejoined"), "1") << e1.output;
  const std::vector<std::string> synced0 = Lines(e0.output, "SYNCED");
  const std::vector<std::string> synced1 = Lines(e1.output, "SYNCED");
  ASSERT_EQ(synced0.size(), 1u) << e0.output;
  ASSERT_EQ(synced1.size(), 1u) << e1.output;
  EXPECT_EQ(ReportedValue(synced1[0], "step"), absl::StrCat(kPauseStep));
  EXPECT_EQ(ReportedValue(synced0[0], "step"), absl::StrCat(kPauseStep));
  EXPECT_EQ(ReportedValue(synced1[0], "root"), "0");
  EXPECT_EQ(ReportedValue(synced1[0], "checksum"),
            ReportedValue(synced0[0], "checksum"));
  EXPECT_EQ(ReportedValue(synced1[0], "iteration"),
            ReportedValue(synced0[0], "iteration"));

  // Every step applied exactly once: the uninterrupted run's parameters.
  EXPECT_EQ(Final(e0.output, "steps"), kSteps);
  EXPECT_EQ(Final(e1.output, "steps"), kSteps);
  EXPECT_EQ(Final(e0.output, "checksum"), reference);
  EXPECT_EQ(Final(e1.output, "checksum"), reference);
}

TEST_F(RankRestartTest, TrainerNotBackWithinTheGraceFailsTheJob) {
  Proc r0;
  StartAndKillRank1("gone", "1500", &r0);
  Exit e0 = Wait(r0, kTimeout);
  EXPECT_EQ(e0.code, 1) << e0.output;
  EXPECT_THAT(e0.output, HasSubstr("ERROR"));
  EXPECT_THAT(e0.output, HasSubstr("local rank 1"));
  EXPECT_THAT(e0.output, HasSubstr("rank_restart_grace_ms"));
  EXPECT_THAT(e0.output, Not(HasSubstr("ABORTED step=")));
  EXPECT_THAT(e0.output, Not(HasSubstr("FINAL")));
}

TEST_F(RankRestartTest, WithoutGraceAKilledTrainerFailsTheJobAtOnce) {
  Proc r0;
  StartAndKillRank1("nograce", "0", &r0);
  Exit e0 = Wait(r0, kTimeout);
  EXPECT_EQ(e0.code, 1) << e0.output;
  EXPECT_THAT(e0.output, HasSubstr("ERROR WaitAll: ABORTED"));
  EXPECT_THAT(e0.output, HasSubstr("local rank 1"));
  // A failed job, not an aborted iteration to retry.
  EXPECT_THAT(e0.output, Not(HasSubstr("ABORTED step=")));
  EXPECT_THAT(e0.output, Not(HasSubstr("FINAL")));
  // Well within the wait timeout: nobody waited for a restart.
  EXPECT_LT(e0.elapsed, milliseconds(20000));
}

}  // namespace
}  // namespace gradd::testing
