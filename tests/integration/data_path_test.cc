// The real gradd with real trainer processes: averages checked exactly over
// many iterations, random ready orders, mixed dtypes and many buckets; the C
// ABI and the example trainer; a clean SIGTERM with trainers attached.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace gradd::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Number after "key=" in a trainer's output, or -1.
long Field(const std::string& output, const std::string& key) {
  size_t at = output.find(key + "=");
  if (at == std::string::npos) return -1;
  return std::strtol(output.c_str() + at + key.size() + 1, nullptr, 10);
}

class DataPathTest : public GraddTest {
 protected:
  void RunMixed(int world, int iterations, int threads) {
    const std::string job = absl::StrCat("mixed", world);
    std::vector<Exit> exits =
        RunJob(job, world,
               {"--iterations", absl::StrCat(iterations), "--seed", "12345",
                "--threads", absl::StrCat(threads), "--bucket-cap-mb", "0.01",
                "--first-bucket-cap-mb", "0.002"},
               milliseconds(60000));
    long buckets = -1;
    for (int r = 0; r < world; ++r) {
      const Exit& e = exits[r];
      ASSERT_EQ(e.code, 0) << "rank " << r << ":\n" << e.output;
      EXPECT_THAT(e.output,
                  HasSubstr(absl::StrCat("PASS iterations=", iterations)));
      EXPECT_EQ(Field(e.output, "world"), world);
      // Every registered value is verified in every iteration.
      EXPECT_GT(Field(e.output, "verified"), 0);
      if (r == 0) buckets = Field(e.output, "buckets");
      EXPECT_EQ(Field(e.output, "buckets"), buckets) << "ranks disagree";
    }
    // The small caps must split the model (~25k elements in 4 dtypes, 96 KB)
    // into many buckets, several per dtype.
    EXPECT_GE(buckets, 8);
  }
};

TEST_F(DataPathTest, TwoTrainersMixedDtypesRandomOrder) { RunMixed(2, 120, 1); }

TEST_F(DataPathTest, FourTrainersMixedDtypesRandomOrderThreadedMarks) {
  RunMixed(4, 100, 2);
}

TEST_F(DataPathTest, CAbi) {
  const std::string missing = dir_ + "/nobody/gradd.sock";
  Proc none = Spawn("c_nodaemon", {GRADD_C_TRAINER, "nodaemon", missing});
  Exit e = Wait(none, milliseconds(10000));
  EXPECT_EQ(e.code, 0) << e.output;

  std::vector<Proc> ps;
  for (int r = 0; r < 2; ++r) {
    ps.push_back(
        Spawn(absl::StrCat("c_rank", r), {GRADD_C_TRAINER, "train", socket_,
                                          "cjob", absl::StrCat(r), "2", "20"}));
  }
  for (Proc& p : ps) {
    Exit x = Wait(p, milliseconds(30000));
    EXPECT_EQ(x.code, 0) << x.output;
    EXPECT_THAT(x.output, HasSubstr("PASS iterations=20"));
  }
}

TEST_F(DataPathTest, CAbiFindUnusedParameters) {
  std::vector<Proc> ps;
  for (int r = 0; r < 2; ++r) {
    ps.push_back(Spawn(
        absl::StrCat("c_unused", r),
        {GRADD_C_TRAINER, "unused", socket_, "cunused", absl::StrCat(r), "2"}));
  }
  for (Proc& p : ps) {
    Exit x = Wait(p, milliseconds(30000));
    EXPECT_EQ(x.code, 0) << x.output;
    EXPECT_THAT(x.output, HasSubstr("PASS unused"));
  }
}

// The C ABI chooses the job's communication hook at attach.
TEST_F(DataPathTest, CAbiCommHook) {
  Proc bad_proc = Spawn("c_badhook", {GRADD_C_TRAINER, "badhook", socket_});
  Exit bad = Wait(bad_proc, milliseconds(10000));
  EXPECT_EQ(bad.code, 0) << bad.output;
  std::vector<Proc> ps;
  for (int r = 0; r < 2; ++r) {
    ps.push_back(Spawn(absl::StrCat("c_fp16_rank", r),
                       {GRADD_C_TRAINER, "train", socket_, "cfp16",
                        absl::StrCat(r), "2", "5", "fp16_compress"}));
  }
  for (Proc& p : ps) {
    Exit x = Wait(p, milliseconds(30000));
    EXPECT_EQ(x.code, 0) << x.output;
    EXPECT_THAT(x.output, HasSubstr("PASS iterations=5"));
  }
}

TEST_F(DataPathTest, ExampleTrainer) {
  std::vector<Proc> ps;
  for (int r = 0; r < 2; ++r) {
    ps.push_back(
        Spawn(absl::StrCat("example", r),
              {GRADD_EXAMPLE_TRAINER, "--socket", socket_, "--job", "example",
               "--local-rank", absl::StrCat(r), "--local-world-size", "2",
               "--iterations", "5", "--params", "300000"}));
  }
  for (Proc& p : ps) {
    Exit x = Wait(p, milliseconds(30000));
    EXPECT_EQ(x.code, 0) << x.output;
    EXPECT_THAT(x.output, HasSubstr("iterations/s"));
    EXPECT_THAT(x.output, HasSubstr("verified"));
  }
}

// No socket in the options: the client takes $GRADD_SOCKET.
TEST_F(DataPathTest, SocketFromEnvironment) {
  ASSERT_EQ(setenv("GRADD_SOCKET", socket_.c_str(), 1), 0);
  std::vector<Exit> exits = RunJob(
      "env", 2, {"--socket", "", "--iterations", "3"}, milliseconds(20000));
  unsetenv("GRADD_SOCKET");
  for (const Exit& e : exits) {
    EXPECT_EQ(e.code, 0) << e.output;
    EXPECT_THAT(e.output, HasSubstr("PASS iterations=3"));
  }
}

TEST_F(DataPathTest, Broadcast) {
  std::vector<Exit> exits =
      RunJob("bcast", 2, {"--iterations", "3", "--broadcast-bytes", "10000"},
             milliseconds(30000));
  for (const Exit& e : exits) {
    EXPECT_EQ(e.code, 0) << e.output;
    EXPECT_THAT(e.output, HasSubstr("BROADCAST_OK bytes=10000"));
    EXPECT_THAT(e.output, HasSubstr("PASS"));
  }
}

TEST_F(DataPathTest, SigtermWithTrainersAttached) {
  struct stat st;
  ASSERT_EQ(stat((dir_ + "/run").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "socket directory not owner-only";

  std::vector<Proc> ps;
  for (int r = 0; r < 2; ++r) {
    ps.push_back(SpawnTrainer("term", r, 2,
                              {"--iterations", "1000000", "--sleep-ms", "5"}));
  }
  for (const Proc& p : ps) {
    ASSERT_TRUE(WaitForText(p, "ATTACHED", milliseconds(20000)))
        << ReadFile(p.log);
  }
  std::optional<int> code = StopDaemon();
  EXPECT_EQ(code, 0) << ReadFile(daemon_.log);
  daemon_.pid = -1;
  EXPECT_NE(access(socket_.c_str(), F_OK), 0) << socket_ << " left behind";
  for (Proc& p : ps) {
    Exit e = Wait(p, milliseconds(5000));
    EXPECT_EQ(e.code, 3) << "trainer must fail with a gradd error:\n"
                         << e.output;
    // UNAVAILABLE: the daemon went away, the job cannot go on.
    EXPECT_THAT(e.output, HasSubstr("ERROR code=14"));
    EXPECT_THAT(e.output, HasSubstr("shutting down"));
    EXPECT_THAT(e.output, Not(HasSubstr("PASS")));
  }
}

}  // namespace
}  // namespace gradd::testing
