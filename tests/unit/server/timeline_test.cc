#include "server/engine/timeline.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "server/engine/trace_json.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

BucketEvent Bucket(uint64_t iteration, int bucket, const int64_t* ready,
                   size_t ranks) {
  BucketEvent e;
  e.iteration = iteration;
  e.bucket = bucket;
  e.num_buckets = 2;
  e.start_ns = 1000;
  e.phases.local_reduce = {1000, 100};
  e.phases.network = {1100, 300};
  e.phases.write_back = {1400, 50};
  e.done_ns = 1500;
  e.rank_ready_ns = absl::MakeConstSpan(ready, ranks);
  return e;
}

std::vector<std::string> Phases(const std::vector<TimelineEvent>& events) {
  std::vector<std::string> out;
  for (const TimelineEvent& e : events) {
    out.push_back(e.phase + "@" + std::to_string(e.local_rank));
  }
  return out;
}

TEST(TimelineTest, KeepsEachRanksReadyAndTheNodesPhases) {
  Timeline timeline(100);
  const int64_t ready[] = {600, 0, 900};  // rank 1: not seen (unknown)
  timeline.OnBucket(Bucket(7, 1, ready, 3));
  const std::vector<TimelineEvent> events = timeline.Snapshot();
  EXPECT_THAT(Phases(events),
              ElementsAre("ready@0", "ready@2", "local_reduce@-1", "network@-1",
                          "write_back@-1", "done@-1"));
  for (const TimelineEvent& e : events) {
    EXPECT_EQ(e.iteration, 7u);
    EXPECT_EQ(e.bucket, 1);
  }
  // Ready lasts until the bucket started; times are Unix times.
  EXPECT_EQ(events[0].duration_ns, 400);
  EXPECT_EQ(events[1].duration_ns, 100);
  EXPECT_EQ(events[3].duration_ns, 300);
  EXPECT_EQ(events[3].start_unix_ns - events[2].start_unix_ns, 100);
  EXPECT_EQ(events[5].duration_ns, 0);
  EXPECT_EQ(events[0].start_unix_ns, EngineToUnixNs(600));
}

TEST(TimelineTest, SkipsPhasesThatDidNotRun) {
  Timeline timeline(100);
  BucketEvent e = Bucket(1, 0, nullptr, 0);
  e.phases.network = {};
  e.phases.write_back = {};
  timeline.OnBucket(e);
  EXPECT_THAT(Phases(timeline.Snapshot()),
              ElementsAre("local_reduce@-1", "done@-1"));
}

TEST(TimelineTest, RingIsBoundedAndKeepsTheNewestInOrder) {
  Timeline timeline(10);
  EXPECT_EQ(timeline.capacity(), 10u);
  for (uint64_t it = 1; it <= 5; ++it) {
    timeline.OnBucket(Bucket(it, 0, nullptr, 0));  // 4 events each
  }
  const std::vector<TimelineEvent> events = timeline.Snapshot();
  ASSERT_EQ(events.size(), 10u);
  // 20 written, the last 10 kept: the end of iteration 3, then 4 and 5.
  EXPECT_EQ(events.front().iteration, 3u);
  EXPECT_EQ(events.front().phase, "write_back");
  EXPECT_EQ(events.back().iteration, 5u);
  EXPECT_EQ(events.back().phase, "done");
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_LE(events[i - 1].iteration, events[i].iteration);
  }
}

TEST(TimelineTest, ZeroCapacityStillHoldsOne) {
  Timeline timeline(0);
  timeline.OnBucket(Bucket(1, 0, nullptr, 0));
  EXPECT_EQ(timeline.Snapshot().size(), 1u);
}

google::protobuf::Struct ParseJson(const std::string& json) {
  google::protobuf::Struct parsed;
  const auto status =
      google::protobuf::util::JsonStringToMessage(json, &parsed);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return parsed;
}

TEST(TraceJsonTest, IsChromeTraceJsonWithCompleteEventsInMicroseconds) {
  std::vector<TimelineEvent> events(2);
  events[0] = {3, 1, 0, "ready", 1700000000123456789, 2500};
  events[1] = {3, 1, -1, "network", 1700000000123459289, 1000000};
  const std::string json = ChromeTraceJson("job \"a\"", events, "n1", 2);
  const google::protobuf::Struct trace = ParseJson(json);
  EXPECT_EQ(trace.fields()
                .at("otherData")
                .struct_value()
                .fields()
                .at("job_id")
                .string_value(),
            "job \"a\"");
  const auto& list = trace.fields().at("traceEvents").list_value().values();
  std::vector<const google::protobuf::Struct*> complete;
  std::vector<std::string> names;
  for (const auto& v : list) {
    const auto& f = v.struct_value().fields();
    if (f.at("ph").string_value() == "X") complete.push_back(&v.struct_value());
    if (f.at("ph").string_value() == "M") {
      names.push_back(
          f.at("args").struct_value().fields().at("name").string_value());
    }
  }
  EXPECT_THAT(names,
              ElementsAre("node n1", "daemon (node phases)", "local rank 0"));
  ASSERT_EQ(complete.size(), 2u);
  const auto& ready = complete[0]->fields();
  EXPECT_EQ(ready.at("name").string_value(), "ready");
  EXPECT_EQ(ready.at("pid").number_value(), 2);
  EXPECT_EQ(ready.at("tid").number_value(), 1);  // local rank 0
  EXPECT_DOUBLE_EQ(ready.at("dur").number_value(), 2.5);
  EXPECT_EQ(
      ready.at("args").struct_value().fields().at("bucket").number_value(), 1);
  const auto& network = complete[1]->fields();
  EXPECT_EQ(network.at("tid").number_value(), 0);  // the node's phases
  EXPECT_DOUBLE_EQ(network.at("dur").number_value(), 1000);
  // The timestamp keeps its sub-microsecond digits in the text.
  EXPECT_THAT(json, HasSubstr("\"ts\":1700000000123456.789"));
}

TEST(TraceJsonTest, SeveralNodesAreProcessesAndEmptyIsValid) {
  std::vector<TraceNode> nodes(2);
  nodes[0].node_id = "a";
  nodes[0].node_rank = 0;
  nodes[0].events = {{1, 0, -1, "done", 5000, 0}};
  nodes[1].node_id = "b\n";
  nodes[1].node_rank = 1;
  nodes[1].events = {{1, 0, 1, "ready", 4000, 1000}};
  const google::protobuf::Struct trace = ParseJson(ChromeTraceJson("j", nodes));
  std::vector<double> pids;
  for (const auto& v : trace.fields().at("traceEvents").list_value().values()) {
    if (v.struct_value().fields().at("ph").string_value() == "X") {
      pids.push_back(v.struct_value().fields().at("pid").number_value());
    }
  }
  EXPECT_THAT(pids, ElementsAre(0, 1));
  ParseJson(ChromeTraceJson("j", std::vector<TimelineEvent>()));
  ParseJson(ChromeTraceJson("j", absl::Span<const TraceNode>()));
}

TEST(TraceJsonTest, JsonStringEscapes) {
  EXPECT_EQ(JsonString("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\u0001\"");
}

}  // namespace
}  // namespace gradd
