// graddctl against a real daemon with a real job: two test trainers that
// run two iterations and then hang mid-iteration (--mode stall), so the job
// stays attached at a known iteration while graddctl asks about it. Every
// answer is checked in its human form and, where scripts would read it, in
// its --json form (parsed by Debian's python3); exit codes as args.h.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace gradd::testing {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

class GraddctlTest : public GraddTest {
 protected:
  // Runs graddctl with `args` (after --socket socket_ unless `socket` is
  // false) and waits for it, bounded.
  Exit Ctl(std::vector<std::string> args, bool socket = true) {
    std::vector<std::string> argv = {GRADDCTL_BINARY};
    if (socket) {
      argv.push_back("--socket");
      argv.push_back(socket_);
    }
    argv.insert(argv.end(), args.begin(), args.end());
    Proc p = Spawn(absl::StrCat("graddctl.", ++runs_), argv);
    return Wait(p, milliseconds(20000));
  }

  // Debian's python3 on `json` (the text of one JSON document): "ok" when
  // `check`, a Python expression over the parsed `t`, is true.
  std::string CheckJson(const std::string& json, const std::string& check) {
    const std::string data = absl::StrCat(dir_, "/check", ++runs_, ".json");
    const std::string script = absl::StrCat(dir_, "/check", runs_, ".py");
    std::ofstream(data) << json;
    std::ofstream(script) << "import json, sys\n"
                          << "t = json.load(open(sys.argv[1]))\n"
                          << "print('ok' if (" << check
                          << ") else 'check failed: %r' % (t,))\n";
    Proc p = Spawn(absl::StrCat("python.", runs_),
                   {"/usr/bin/python3", script, data});
    std::string out = Wait(p, milliseconds(20000)).output;
    while (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  }

  // A 2-rank job (on the fixture's daemon) that completes 2 iterations
  // and then hangs in its third.
  bool StartStalledJob(const std::string& job) {
    for (int r = 0; r < 2; ++r) {
      trainers_.push_back(
          SpawnTrainer(job, r, 2, {"--mode", "stall", "--stall-at", "3"}));
    }
    for (const Proc& t : trainers_) {
      if (!WaitForText(t, "STALLED", milliseconds(30000))) {
        ADD_FAILURE() << t.name << " never stalled:\n" << ReadFile(t.log);
        return false;
      }
    }
    return true;
  }

  int runs_ = 0;
  std::vector<Proc> trainers_;
};

TEST_F(GraddctlTest, AnswersAboutARunningJob) {
  ASSERT_TRUE(StartStalledJob("stalljob"));
  const std::string pid0 = absl::StrCat(trainers_[0].pid);
  const std::string pid1 = absl::StrCat(trainers_[1].pid);

  Exit status = Ctl({"status"});
  EXPECT_EQ(status.code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr("1 running, 0 pending"));
  EXPECT_THAT(status.output, HasSubstr(socket_));
  status = Ctl({"status", "--json"});
  ASSERT_EQ(status.code, 0) << status.output;
  EXPECT_EQ(CheckJson(status.output,
                      "t['running_jobs'] == 1 and t['sessions'] == 2 and "
                      "t['version'] != '' and int(t['uptime_ns']) > 0"),
            "ok");

  Exit jobs = Ctl({"jobs"});
  EXPECT_EQ(jobs.code, 0) << jobs.output;
  // ID STATE RANKS NODES WORLD ITERATION ...
  EXPECT_THAT(jobs.output, ContainsRegex("stalljob +running +2/2 +1 +2 +2 "));
  jobs = Ctl({"jobs", "--json"});
  ASSERT_EQ(jobs.code, 0) << jobs.output;
  EXPECT_EQ(CheckJson(jobs.output,
                      "[j['job_id'] for j in t['jobs']] == ['stalljob'] and "
                      "t['jobs'][0]['iteration'] == '2'"),
            "ok");

  Exit job = Ctl({"job", "stalljob"});
  EXPECT_EQ(job.code, 0) << job.output;
  for (const std::string& want :
       {std::string("job stalljob: running, iteration 2"), pid0, pid1,
        std::string("plan: "), std::string("ddp logging data"),
        std::string("world_size")}) {
    EXPECT_THAT(job.output, HasSubstr(want));
  }
  job = Ctl({"--json", "job", "stalljob"});
  ASSERT_EQ(job.code, 0) << job.output;
  EXPECT_EQ(
      CheckJson(job.output,
                absl::StrCat(
                    "t['job']['summary']['iteration'] == '2' and "
                    "sorted(r['pid'] for r in t['job']['ranks']) == sorted([",
                    pid0, ", ", pid1,
                    "]) and all(r['state'] == 'RANK_STATE_LIVE' for r in "
                    "t['job']['ranks']) and len(t['job']['plan']['buckets']) "
                    "== t['job']['summary']['num_buckets'] > 0 and "
                    "min(int(b['done_iteration']) for b in "
                    "t['job']['plan']['buckets']) == 2 and "
                    "t['job']['ddp_logging_data']['world_size'] == '2' and "
                    "len(t['job']['parameters']) > 0")),
      "ok");

  Exit config = Ctl({"config"});
  EXPECT_EQ(config.code, 0) << config.output;
  EXPECT_THAT(config.output, HasSubstr(socket_));
  config = Ctl({"config", "--json"});
  ASSERT_EQ(config.code, 0) << config.output;
  EXPECT_EQ(
      CheckJson(config.output, absl::StrCat("t['socket_path'] == '", socket_,
                                            "' and t['max_jobs'] > 0")),
      "ok");

  Exit health = Ctl({"health"});
  EXPECT_EQ(health.code, 0) << health.output;
  EXPECT_EQ(health.output, "SERVING\n");
  health = Ctl({"health", "--service", "gradd.v1.Node", "--timeout", "3s"});
  EXPECT_EQ(health.code, 0) << health.output;

  const std::string out = absl::StrCat(dir_, "/stalljob.trace.json");
  Exit trace = Ctl({"trace", "stalljob", "--out", out});
  EXPECT_EQ(trace.code, 0) << trace.output;
  EXPECT_THAT(trace.output, HasSubstr("events of job stalljob"));
  EXPECT_EQ(CheckJson(ReadFile(out),
                      "isinstance(t['traceEvents'], list) and "
                      "t['otherData']['job_id'] == 'stalljob' and "
                      "all(e['ph'] in ('X', 'M') for e in t['traceEvents'])"),
            "ok");
  // The engine's timeline: both ranks handed over, and the node reduced
  // and handed back, every bucket of the two finished iterations.
  EXPECT_EQ(
      CheckJson(ReadFile(out),
                "[x for x in [[e for e in t['traceEvents'] if e['ph'] == 'X']] "
                "if {e['cat'] for e in x} >= {'ready', 'done'} and "
                "{e['args']['local_rank'] for e in x if e['cat'] == 'ready'} "
                "== {0, 1} and {e['args']['iteration'] for e in x if "
                "e['cat'] == 'done'} >= {1, 2} and all(e['dur'] >= 0 for e in "
                "x)] != []"),
      "ok");
}

TEST_F(GraddctlTest, ErrorsGiveExitCodesScriptsCanUse) {
  Exit missing = Ctl({"job", "NONEXISTENT"});
  EXPECT_EQ(missing.code, 1) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("no job 'NONEXISTENT'"));
  Exit trace = Ctl({"trace", "NONEXISTENT", "--out", dir_ + "/t.json"});
  EXPECT_EQ(trace.code, 1) << trace.output;
  Exit service = Ctl({"health", "--service", "no.such.Service"});
  EXPECT_EQ(service.code, 1) << service.output;

  EXPECT_EQ(Ctl({"frobnicate"}).code, 2);
  EXPECT_EQ(Ctl({"job"}).code, 2);
  EXPECT_EQ(Ctl({"status", "--timeout", "soon"}).code, 2);
  Exit help = Ctl({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_THAT(help.output, HasSubstr("exit codes"));

  // Nobody serves this socket: unreachable, quickly.
  Exit nobody = Ctl({"--socket", dir_ + "/nobody.sock", "health"},
                    /*socket=*/false);
  EXPECT_EQ(nobody.code, 3) << nobody.output;
  EXPECT_THAT(nobody.output, HasSubstr("cannot reach gradd"));

  // $GRADD_SOCKET is the default socket.
  setenv("GRADD_SOCKET", socket_.c_str(), 1);
  Exit by_env = Ctl({"health"}, /*socket=*/false);
  unsetenv("GRADD_SOCKET");
  EXPECT_EQ(by_env.code, 0) << by_env.output;

  // A daemon that does not run at all (SIGSTOP): no answer within
  // --timeout, exit 3, and graddctl's own wait is what bounds it.
  ASSERT_EQ(kill(daemon_.pid, SIGSTOP), 0);
  Exit frozen = Ctl({"health", "--timeout", "500ms"});
  ASSERT_EQ(kill(daemon_.pid, SIGCONT), 0);
  EXPECT_EQ(frozen.code, 3) << frozen.output;
  EXPECT_THAT(frozen.output, HasSubstr("no answer from gradd"));
  EXPECT_LT(frozen.elapsed, milliseconds(10000));
  Exit thawed = Ctl({"health"});
  EXPECT_EQ(thawed.code, 0) << thawed.output;

  ASSERT_EQ(StopDaemon(), 0);
  Exit stopped = Ctl({"status"});
  EXPECT_EQ(stopped.code, 3) << stopped.output;
}

}  // namespace
}  // namespace gradd::testing
