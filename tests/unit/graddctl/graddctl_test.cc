// graddctl's library: argument parsing, exit codes, tables and the Chrome
// trace writer (its output parsed by Debian's python3 json module).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "tools/graddctl/args.h"
#include "tools/graddctl/format.h"
#include "tools/graddctl/trace.h"

namespace gradd::ctl {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

absl::StatusOr<Options> Parse(std::vector<std::string> args) {
  return ParseArgs(args, "/default.sock");
}

TEST(GraddctlArgsTest, CommandsAndFlagsAnywhere) {
  absl::StatusOr<Options> o = Parse({"status"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->command, Command::kStatus);
  EXPECT_EQ(o->socket, "/default.sock");
  EXPECT_FALSE(o->json);
  EXPECT_EQ(o->timeout, absl::Seconds(5));

  o = Parse({"job", "resnet", "--json", "--socket", "/s.sock"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->command, Command::kJob);
  EXPECT_EQ(o->job_id, "resnet");
  EXPECT_TRUE(o->json);
  EXPECT_EQ(o->socket, "/s.sock");

  o = Parse({"--timeout=500ms", "trace", "j", "--out", "t.json"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->command, Command::kTrace);
  EXPECT_EQ(o->timeout, absl::Milliseconds(500));
  EXPECT_EQ(o->out, "t.json");

  o = Parse({"health", "--timeout", "1.5", "--service", "gradd.v1.Node"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->timeout, absl::Milliseconds(1500));
  EXPECT_EQ(o->service, "gradd.v1.Node");

  EXPECT_EQ(Parse({"--help"})->command, Command::kHelp);
  EXPECT_EQ(Parse({"jobs"})->command, Command::kJobs);
  EXPECT_EQ(Parse({"config"})->command, Command::kConfig);
}

TEST(GraddctlArgsTest, BadUsageNamesTheProblem) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{}, "no command"},
      {{"frobnicate"}, "unknown command 'frobnicate'"},
      {{"job"}, "needs a job id"},
      {{"jobs", "extra"}, "unexpected argument 'extra'"},
      {{"trace", "j"}, "needs --out"},
      {{"status", "--out", "x"}, "only for trace"},
      {{"status", "--service", "x"}, "only for health"},
      {{"status", "--bogus"}, "unknown flag --bogus"},
      {{"status", "--timeout"}, "needs a value"},
      {{"status", "--timeout", "soon"}, "not a duration"},
      {{"status", "--timeout", "0"}, "positive"},
      {{"status", "--json=1"}, "takes no value"},
      {{"status", "--socket="}, "needs a path"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Options> o = Parse(c.args);
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument)
        << ::testing::PrintToString(c.args);
    EXPECT_THAT(o.status().message(), HasSubstr(c.message))
        << ::testing::PrintToString(c.args);
  }
  EXPECT_EQ(ParseArgs({"status"}, "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GraddctlArgsTest, ExitCodesSeparateErrorsFromUnreachable) {
  EXPECT_EQ(ExitCodeFor(grpc::Status::OK), kExitOk);
  EXPECT_EQ(ExitCodeFor(grpc::Status(grpc::StatusCode::NOT_FOUND, "")),
            kExitError);
  EXPECT_EQ(ExitCodeFor(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "")),
            kExitError);
  EXPECT_EQ(ExitCodeFor(grpc::Status(grpc::StatusCode::UNAVAILABLE, "")),
            kExitUnreachable);
  EXPECT_EQ(ExitCodeFor(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "")),
            kExitUnreachable);
  EXPECT_THAT(Usage(), HasSubstr("exit codes"));
}

TEST(GraddctlFormatTest, TableAlignsColumns) {
  EXPECT_EQ(Table({"A", "LONG"}, {{"xyz", "1"}, {"q"}}, 2),
            "  A    LONG\n"
            "  xyz  1\n"
            "  q\n");
}

TEST(GraddctlFormatTest, HumanUnits) {
  EXPECT_EQ(HumanBytes(512), "512 B");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(25ull << 20), "25.0 MiB");
  EXPECT_EQ(HumanDuration(850), "850 ns");
  EXPECT_EQ(HumanDuration(12300), "12.3 us");
  EXPECT_EQ(HumanDuration(4560000), "4.56 ms");
  EXPECT_EQ(HumanDuration(2500000000), "2.50 s");
  EXPECT_EQ(HumanDuration(int64_t{3 * 3600 + 2 * 60 + 5} * 1000000000),
            "3h02m05s");
  EXPECT_EQ(HumanDuration(int64_t{27 * 3600} * 1000000000), "1d03h");
}

// Issue 20: how the daemon talks to the others is on the status page, an
// insecure daemon included.
TEST(GraddctlFormatTest, StatusShowsHowDaemonCallsAreSecured) {
  v1::GetStatusResponse s;
  s.set_version("0.1.0");
  s.set_network_security(
      "INSECURE (rendezvous.insecure: true): daemon calls carry no "
      "credentials");
  EXPECT_THAT(FormatStatus(s),
              ::testing::ContainsRegex("daemon network +INSECURE "
                                       "\\(rendezvous.insecure: true\\)"));
  s.clear_network_security();
  EXPECT_THAT(FormatStatus(s), ::testing::HasSubstr("daemon network  -"));
}

// Issue 34: where the rendezvous store is, and on etcd this daemon's lease.
TEST(GraddctlFormatTest, StatusShowsTheRendezvousBackend) {
  v1::GetStatusResponse s;
  // An older daemon says nothing of it: no row.
  EXPECT_THAT(FormatStatus(s), Not(HasSubstr("rendezvous")));
  v1::RendezvousStatus* r = s.mutable_rendezvous();
  r->set_backend("builtin");
  r->set_port(29600);
  EXPECT_THAT(FormatStatus(s),
              HasSubstr("rendezvous      builtin, coordinator named per job "
                        "by the trainers (GRADD_COORDINATOR, else "
                        "MASTER_ADDR; port 29600)\n"));
  r->set_coordinator_address("10.0.0.1:29600");
  r->set_serving_address("0.0.0.0:29600");
  EXPECT_THAT(FormatStatus(s),
              HasSubstr("rendezvous      builtin, coordinator 10.0.0.1:29600; "
                        "this daemon serves the store on 0.0.0.0:29600\n"));
  EXPECT_THAT(FormatStatus(s), Not(HasSubstr("etcd lease")));
}

TEST(GraddctlFormatTest, StatusShowsTheEtcdLease) {
  v1::GetStatusResponse s;
  v1::RendezvousStatus* r = s.mutable_rendezvous();
  r->set_backend("etcd");
  r->add_etcd_endpoints("10.0.0.1:2379");
  r->add_etcd_endpoints("10.0.0.2:2379");
  r->set_etcd_security("mTLS + user gradd");
  r->set_etcd_prefix("/gradd/");
  v1::EtcdLeaseStatus* l = r->mutable_lease();
  l->set_id(0x694d7b5e2f3a1c04);
  l->set_held(true);
  l->set_ttl_ms(30000);
  l->set_last_kept_alive_unix_ns(1700000000000000000);
  l->set_last_kept_alive_age_ns(2100000000);
  l->set_grants(1);
  std::string out = FormatStatus(s);
  EXPECT_THAT(out, HasSubstr("rendezvous      etcd at 10.0.0.1:2379,"
                             "10.0.0.2:2379 (mTLS + user gradd, prefix "
                             "/gradd/)\n"));
  EXPECT_THAT(out, HasSubstr("etcd lease      694d7b5e2f3a1c04 held, ttl "
                             "30.00 s, last kept alive 2.10 s ago; granted 1, "
                             "lost 0\n"));
  // etcd unreachable for longer than the TTL: not held, and why.
  l->set_held(false);
  l->set_last_kept_alive_age_ns(int64_t{45} * 1000000000);
  l->set_failed_keepalives(3);
  l->set_last_error("UNAVAILABLE: etcd 10.0.0.1:2379,10.0.0.2:2379: ...");
  out = FormatStatus(s);
  EXPECT_THAT(out, HasSubstr("694d7b5e2f3a1c04 NOT HELD (no answer from etcd "
                             "for a TTL), ttl 30.00 s, last kept alive 45.00 s "
                             "ago; granted 1, lost 0; 3 keep-alives "
                             "unanswered, last: UNAVAILABLE: etcd "));
  // etcd said it expired: the reason, and the count.
  l->set_lost_reason("etcd said it expired");
  l->set_losses(1);
  l->set_failed_keepalives(0);
  EXPECT_THAT(FormatStatus(s),
              HasSubstr("NOT HELD (etcd said it expired), ttl 30.00 s, last "
                        "kept alive 45.00 s ago; granted 1, lost 1\n"));
}

TEST(GraddctlFormatTest, JobsTableHasOneLinePerJob) {
  v1::ListJobsResponse jobs;
  EXPECT_EQ(FormatJobs(jobs), "no jobs\n");
  v1::JobSummary* j = jobs.add_jobs();
  j->set_job_id("resnet");
  j->set_state(v1::JOB_STATE_RUNNING);
  j->set_local_world_size(4);
  j->set_live_local_ranks(3);
  j->set_num_nodes(2);
  j->set_world_size(8);
  j->set_iteration(120);
  j->set_num_buckets(5);
  j->set_bucket_bytes(3 << 20);
  const std::string out = FormatJobs(jobs);
  EXPECT_THAT(out, HasSubstr("ID"));
  EXPECT_THAT(out, HasSubstr("ITERATION"));
  EXPECT_THAT(out, ::testing::ContainsRegex(
                       "resnet +running +3/4 +2 +8 +120 +5 +3.0 MiB"));
  // Each job's network epoch (issue 34).
  EXPECT_THAT(out, HasSubstr("EPOCH"));
  j->set_epoch(2);
  EXPECT_THAT(FormatJobs(jobs),
              ::testing::ContainsRegex("resnet +running .* +3.0 MiB +2\n"));
}

TEST(GraddctlFormatTest, JobDetailShowsEverySection) {
  v1::JobDetail d;
  d.mutable_summary()->set_job_id("j");
  d.mutable_summary()->set_state(v1::JOB_STATE_FAILED);
  d.mutable_summary()->set_error("ABORTED: local rank 1 left");
  v1::RankInfo* r = d.add_ranks();
  r->set_local_rank(1);
  r->set_global_rank(5);
  r->set_state(v1::RANK_STATE_DISCONNECTED);
  r->set_pid(321);
  d.add_nodes()->set_node_id("node-b");
  d.add_parameters()->set_name("fc.weight");
  d.add_parameters()->set_name("fc.bias");
  v1::BucketInfo* b = d.mutable_plan()->add_buckets();
  b->set_dtype("float16");
  b->set_size_bytes(2048);
  b->add_params(1);
  b->add_params(0);
  b->set_done_iteration(7);
  d.set_used_map(true);
  d.set_unused_iteration(7);
  d.add_unused_parameters("fc.bias");
  d.add_ready_order(0);
  d.set_rebuilt(true);
  d.set_rebuild_iteration(1);
  d.add_rebuild_ready_order(1);
  d.add_rebuild_ready_order(0);
  v1::BucketTiming* t = d.add_bucket_timings();
  v1::PhaseTiming* p = t->add_phases();
  p->set_phase("network");
  p->set_count(2);
  p->set_total_ns(4000);
  v1::Stall* s = d.add_stalls();
  s->set_bucket(0);
  s->set_waited_seconds(31);
  s->add_missing_nodes("node-c");
  d.mutable_ddp_logging_data()->set_world_size(8);
  d.mutable_ddp_logging_data()->set_can_set_static_graph(0);
  d.set_note("timeline partial");
  const std::string out = FormatJob(d);
  for (const char* want :
       {"job j: failed", "error: ABORTED: local rank 1 left", "disconnected",
        "321", "node-b", "float16", "2.0 KiB", "fc.bias, fc.weight",
        "unused parameters (iteration 7): fc.bias", "ready order: 0",
        "rebuild: after iteration 1, from parameter ready order 1, 0",
        "network", "2.0 us", "31.0 s", "node-c", "world_size",
        "can_set_static_graph", "note: timeline partial"}) {
    EXPECT_THAT(out, HasSubstr(want)) << out;
  }
  // Unset optional fields and unknown lists are left out.
  EXPECT_THAT(out, Not(HasSubstr("unused_parameter_size")));
  EXPECT_THAT(out, Not(HasSubstr("rebuilt_bucket_sizes")));
}

TEST(GraddctlFormatTest, JobDetailShowsRankRestart) {
  v1::JobDetail d;
  v1::JobSummary* s = d.mutable_summary();
  s->set_job_id("r");
  s->set_state(v1::JOB_STATE_RUNNING);
  s->set_local_world_size(2);
  s->set_live_local_ranks(1);
  s->set_world_size(2);
  s->set_rank_restart_grace_ms(30000);
  s->set_restarting_local_ranks(1);
  s->set_restarts(3);
  s->set_iterations_aborted(2);
  v1::RankInfo* live = d.add_ranks();
  live->set_local_rank(0);
  live->set_state(v1::RANK_STATE_LIVE);
  v1::RankInfo* away = d.add_ranks();
  away->set_local_rank(1);
  away->set_state(v1::RANK_STATE_RESTARTING);
  away->set_restart_ms_left(12500);
  const std::string out = FormatJob(d);
  EXPECT_THAT(out, HasSubstr("rank restart: grace 30000 ms, 1 local ranks "
                             "restarting now, 3 restarts, 2 iterations "
                             "aborted"));
  EXPECT_THAT(out, HasSubstr("restarting (12.5 s left)"));
  // A job without a grace that never restarted says nothing of it.
  s->set_rank_restart_grace_ms(0);
  s->set_restarts(0);
  EXPECT_THAT(FormatJob(d), Not(HasSubstr("rank restart:")));
}

TEST(GraddctlFormatTest, JobDetailShowsTheLiveNodes) {
  v1::JobDetail d;
  v1::JobSummary* s = d.mutable_summary();
  s->set_job_id("e");
  s->set_state(v1::JOB_STATE_RUNNING);
  s->set_local_world_size(2);
  s->set_num_nodes(2);
  s->set_world_size(4);
  s->set_initial_num_nodes(3);
  s->set_min_nodes(2);
  // Formed, not yet re-formed: the nodes line without a reason.
  s->add_live_node_ids("a");
  s->add_live_node_ids("b");
  EXPECT_THAT(FormatJob(d), AllOf(HasSubstr("nodes: epoch 0, 2 of 3 live "
                                            "(a, b), min_nodes 2, lost: none"),
                                  Not(HasSubstr("last re-formation"))));
  s->set_epoch(1);
  s->add_lost_node_ids("c");
  s->set_last_reformation_reason("node 'c' (node rank 2) is gone");
  const std::string out = FormatJob(d);
  EXPECT_THAT(out, HasSubstr("nodes: epoch 1, 2 of 3 live (a, b), min_nodes "
                             "2, lost: c\n"));
  EXPECT_THAT(out,
              HasSubstr("last re-formation: node 'c' (node rank 2) is gone"));
  // A job that is not elastic and never re-formed says nothing of it.
  s->set_min_nodes(0);
  s->set_epoch(0);
  EXPECT_THAT(FormatJob(d), Not(HasSubstr("nodes: epoch")));
}

// The engine's phase (admin.proto JobPhase) follows the state in the
// header line when it says more than the state (draining, re-forming,
// switching plan); running, failed, or none (a daemon older than the field,
// a job not formed) leave the line as it was.
TEST(GraddctlFormatTest, JobShowsTheEnginesPhase) {
  v1::JobDetail d;
  v1::JobSummary* s = d.mutable_summary();
  s->set_job_id("p");
  s->set_state(v1::JOB_STATE_RUNNING);
  EXPECT_THAT(FormatJob(d), AllOf(HasSubstr("job p: running, iteration"),
                                  Not(HasSubstr("phase"))));
  s->set_phase(v1::JOB_PHASE_RUNNING);
  EXPECT_THAT(FormatJob(d), AllOf(HasSubstr("job p: running, iteration"),
                                  Not(HasSubstr("phase"))));
  s->set_phase(v1::JOB_PHASE_REFORMING);
  EXPECT_THAT(FormatJob(d),
              HasSubstr("job p: running (phase reforming), iteration"));
  s->set_phase(v1::JOB_PHASE_SWITCHING_PLAN);
  EXPECT_THAT(FormatJob(d), HasSubstr("(phase switching_plan)"));
}

TEST(GraddctlFormatTest, JobShowsTheBucketCapsAutotune) {
  v1::JobDetail d;
  v1::JobSummary* s = d.mutable_summary();
  s->set_job_id("a");
  s->set_state(v1::JOB_STATE_RUNNING);
  EXPECT_THAT(FormatJob(d), Not(HasSubstr("(auto")));
  v1::BucketAutotune* a = s->mutable_autotune();
  a->set_state(v1::BucketAutotune::STATE_WAITING);
  a->set_bucket_cap_bytes(25 << 20);
  a->set_decided_here(true);
  EXPECT_THAT(FormatJob(d),
              HasSubstr("bucket cap: 25.0 MiB (auto, waiting for the bucket "
                        "rebuild)\n"));
  a->set_state(v1::BucketAutotune::STATE_TUNING);
  a->set_bucket_cap_bytes(4 << 20);
  a->set_trial(2);
  a->set_trials(5);
  v1::BucketAutotune::Trial* t = a->add_trials_done();
  t->set_bucket_cap_bytes(1 << 20);
  t->set_step_ns(12500000);
  t->set_iterations(3);
  EXPECT_THAT(FormatJob(d),
              HasSubstr("bucket cap: 4.0 MiB (auto, tuning, trial 2/5); step "
                        "times: 1.0 MiB 12.50 ms\n"));
  a->set_state(v1::BucketAutotune::STATE_SETTLED);
  a->set_bucket_cap_bytes(10 << 20);
  a->set_settled_after(21);
  a->set_decided_here(false);
  EXPECT_THAT(FormatJob(d),
              HasSubstr("bucket cap: 10.0 MiB (auto, settled after iteration "
                        "21, node rank 0 decides)"));
  a->set_partition_bytes(1 << 20);
  t = a->add_trials_done();
  t->set_bucket_cap_bytes(10 << 20);
  t->set_partition_bytes(0);
  t->set_step_ns(9000000);
  t->set_iterations(3);
  EXPECT_THAT(FormatJob(d),
              HasSubstr("node rank 0 decides), partition 1.0 MiB; step times: "
                        "1.0 MiB 12.50 ms, 10.0 MiB whole buckets 9.00 ms\n"));
}

TEST(GraddctlTraceTest, RestartEventsAreNamedWithoutABucket) {
  v1::GetTraceResponse trace;
  trace.set_job_id("r");
  v1::TraceEvent* e = trace.add_events();
  e->set_phase("rank_restarted");
  e->set_bucket(-1);
  e->set_local_rank(1);
  e->set_iteration(0);
  const std::string json = ChromeTraceJson(trace);
  EXPECT_THAT(json, HasSubstr("\"name\":\"rank_restarted\""));
  EXPECT_THAT(json, Not(HasSubstr("b-1")));
}

TEST(GraddctlFormatTest, JsonUsesProtoNamesAndKeepsDefaults) {
  v1::GetStatusResponse s;
  s.set_version("1.2.3");
  const std::string json = ToJson(s);
  EXPECT_THAT(json, HasSubstr("\"version\":\"1.2.3\""));
  EXPECT_THAT(json, HasSubstr("\"running_jobs\":0"));
  EXPECT_EQ(FormatHealth(grpc::health::v1::HealthCheckResponse::NOT_SERVING),
            "NOT_SERVING\n");
}

TEST(GraddctlTraceTest, JsonStringEscapes) {
  EXPECT_EQ(JsonString("a\"b\\c\n\x01\xc3"),
            "\"a\\\"b\\\\c\\n\\u0001\\u00c3\"");
}

// Runs Debian's python3 on `trace` (json.load, then `check`, a Python
// expression over `t` that must be true); "ok" or what went wrong.
std::string CheckWithPython(const std::string& trace,
                            const std::string& check) {
  ::gradd::testing::TempDir temp("graddctl_trace_");
  if (temp.path().empty()) return "mkdtemp failed";
  const std::string& dir = temp.path();
  const std::string json = absl::StrCat(dir, "/trace.json");
  const std::string script = absl::StrCat(dir, "/check.py");
  std::ofstream(json) << trace;
  std::ofstream(script) << "import json, sys\n"
                        << "t = json.load(open(sys.argv[1]))\n"
                        << "print('ok' if (" << check
                        << ") else 'check failed')\n";
  const std::string cmd =
      absl::StrCat("/usr/bin/python3 ", script, " ", json, " 2>&1");
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r"); p != nullptr) {
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
    pclose(p);
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

TEST(GraddctlTraceTest, EventsBecomeCompleteEventsPerNodeAndRank) {
  v1::GetTraceResponse trace;
  trace.set_job_id("j\"1");
  trace.set_node_id("node-a");
  trace.set_node_rank(2);
  trace.set_note("ring wrapped");
  auto add = [&](int rank, const char* phase, int64_t start, int64_t dur) {
    v1::TraceEvent* e = trace.add_events();
    e->set_iteration(9);
    e->set_bucket(3);
    e->set_local_rank(rank);
    e->set_phase(phase);
    e->set_start_unix_ns(start);
    e->set_duration_ns(dur);
  };
  add(1, "ready", 1700000000123456789, 1500);
  add(-1, "network", 1700000000123460000, 250000);
  const std::string json = ChromeTraceJson(trace);
  EXPECT_EQ(
      CheckWithPython(
          json,
          "[e for e in t['traceEvents'] if e['ph'] == 'X'] == ["
          "{'ph':'X','name':'ready b3','cat':'ready','pid':2,'tid':2,"
          "'ts':1700000000123456.789,'dur':1.5,"
          "'args':{'iteration':9,'bucket':3,'local_rank':1}},"
          "{'ph':'X','name':'network b3','cat':'network','pid':2,'tid':0,"
          "'ts':1700000000123460.0,'dur':250.0,"
          "'args':{'iteration':9,'bucket':3,'local_rank':-1}}]"
          " and {(e['name'], e['tid'], e['args']['name']) for e in "
          "t['traceEvents'] if e['ph'] == 'M'} == {('process_name', 0, "
          "'gradd node-a'), ('thread_name', 0, 'node'), ('thread_name', 2, "
          "'rank 1')} and t['otherData']['note'] == 'ring wrapped' and "
          "t['otherData']['job_id'] == 'j\"1'"),
      "ok")
      << json;
}

TEST(GraddctlTraceTest, EmptyTimelineIsAValidTrace) {
  v1::GetTraceResponse trace;
  trace.set_job_id("j");
  EXPECT_EQ(CheckWithPython(ChromeTraceJson(trace),
                            "len([e for e in t['traceEvents'] if e['ph'] == "
                            "'X']) == 0 and t['otherData']['events'] == 0"),
            "ok");
}

}  // namespace
}  // namespace gradd::ctl
