#include "server/engine/observe/stall_inspector.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int64_t kMs = 1000000;

class RecordingSink : public JobEventSinkInterface {
 public:
  void OnStall(const StallReport& r) override { stalls.push_back(r); }
  std::vector<StallReport> stalls;
};

std::vector<std::string> Params(int bucket) {
  return {"layer" + std::to_string(bucket) + ".weight",
          "layer" + std::to_string(bucket) + ".bias"};
}

BucketWait LocalWait(uint64_t iteration, int bucket, int64_t since,
                     std::vector<int> missing) {
  BucketWait w;
  w.iteration = iteration;
  w.bucket = bucket;
  w.since_ns = since;
  w.missing_local_ranks = std::move(missing);
  return w;
}

StallInspector::Options Opts(int warning_ms, int shutdown_ms) {
  StallInspector::Options o;
  o.job_id = "j";
  o.warning = std::chrono::milliseconds(warning_ms);
  o.shutdown = std::chrono::milliseconds(shutdown_ms);
  o.other_nodes = {"'b' (node rank 1)"};
  return o;
}

TEST(StallInspectorTest, ReportsMissingRanksAndParametersOncePastWarning) {
  StallInspector inspector(Opts(100, 0));
  ASSERT_TRUE(inspector.enabled());
  EXPECT_EQ(inspector.threshold_ns(), 100 * kMs);
  RecordingSink sink;
  // Not yet past the warning: nothing.
  EXPECT_FALSE(
      inspector.Update(50 * kMs, {LocalWait(4, 2, 0, {1, 3})}, Params, &sink)
          .has_value());
  EXPECT_THAT(sink.stalls, IsEmpty());
  EXPECT_THAT(inspector.Current(), IsEmpty());

  EXPECT_FALSE(
      inspector.Update(150 * kMs, {LocalWait(4, 2, 0, {1, 3})}, Params, &sink)
          .has_value());
  ASSERT_EQ(sink.stalls.size(), 1u);
  const StallReport& r = sink.stalls[0];
  EXPECT_EQ(r.job_id, "j");
  EXPECT_EQ(r.iteration, 4u);
  EXPECT_EQ(r.bucket, 2);
  EXPECT_DOUBLE_EQ(r.waited_seconds, 0.15);
  EXPECT_THAT(r.missing_local_ranks, ElementsAre(1, 3));
  EXPECT_THAT(r.missing_nodes, IsEmpty());
  EXPECT_THAT(r.unready_parameters,
              ElementsAre("layer2.weight", "layer2.bias"));
  EXPECT_THAT(r.message,
              AllOf(HasSubstr("job 'j'"), HasSubstr("bucket 2 of iteration 4"),
                    HasSubstr("local ranks 1, 3 have not handed it over"),
                    HasSubstr("'layer2.weight', 'layer2.bias'")));
  EXPECT_EQ(inspector.Current().size(), 1u);

  // Still waiting: listed, but counted only once.
  inspector.Update(300 * kMs, {LocalWait(4, 2, 0, {3})}, Params, &sink);
  EXPECT_EQ(sink.stalls.size(), 1u);
  ASSERT_EQ(inspector.Current().size(), 1u);
  EXPECT_THAT(inspector.Current()[0].missing_local_ranks, ElementsAre(3));

  // It moved on: no stall now; the next iteration's is a new one.
  inspector.Update(400 * kMs, {}, Params, &sink);
  EXPECT_THAT(inspector.Current(), IsEmpty());
  inspector.Update(600 * kMs, {LocalWait(5, 2, 400 * kMs, {3})}, Params, &sink);
  EXPECT_EQ(sink.stalls.size(), 2u);
}

TEST(StallInspectorTest, FailsPastShutdownWithTheReport) {
  StallInspector inspector(Opts(100, 500));
  RecordingSink sink;
  EXPECT_FALSE(
      inspector.Update(200 * kMs, {LocalWait(1, 0, 0, {1})}, Params, &sink));
  std::optional<std::string> fail =
      inspector.Update(500 * kMs, {LocalWait(1, 0, 0, {1})}, Params, &sink);
  ASSERT_TRUE(fail.has_value());
  EXPECT_THAT(*fail, AllOf(HasSubstr("local rank 1 has not handed it over"),
                           HasSubstr("stall_shutdown_ms (500)")));
  EXPECT_EQ(sink.stalls.size(), 1u);
}

TEST(StallInspectorTest, ShutdownAloneAlsoReports) {
  StallInspector inspector(Opts(0, 300));
  EXPECT_EQ(inspector.threshold_ns(), 300 * kMs);
  RecordingSink sink;
  EXPECT_FALSE(
      inspector.Update(200 * kMs, {LocalWait(1, 0, 0, {0})}, Params, &sink));
  EXPECT_TRUE(
      inspector.Update(300 * kMs, {LocalWait(1, 0, 0, {0})}, Params, &sink));
  EXPECT_EQ(sink.stalls.size(), 1u);
}

TEST(StallInspectorTest, NetworkWaitNamesTheOtherNodes) {
  StallInspector inspector(Opts(100, 0));
  BucketWait w;
  w.iteration = 9;
  w.bucket = 0;
  w.since_ns = 0;
  w.in_network = true;
  inspector.Update(2000 * kMs, {w}, Params, nullptr);
  ASSERT_EQ(inspector.Current().size(), 1u);
  const StallReport r = inspector.Current()[0];
  EXPECT_THAT(r.missing_nodes, ElementsAre("'b' (node rank 1)"));
  EXPECT_THAT(r.missing_local_ranks, IsEmpty());
  EXPECT_THAT(r.unready_parameters, IsEmpty());
  EXPECT_THAT(r.message,
              AllOf(HasSubstr("inter-node allreduce"),
                    HasSubstr("'b' (node rank 1)"), HasSubstr("waited 2.0 s")));
}

TEST(StallInspectorTest, OffWhenBothThresholdsAreZero) {
  StallInspector inspector(Opts(0, 0));
  EXPECT_FALSE(inspector.enabled());
  EXPECT_FALSE(inspector.Update(1000000 * kMs, {LocalWait(1, 0, 0, {0})},
                                Params, nullptr));
  EXPECT_THAT(inspector.Current(), IsEmpty());
}

TEST(StallInspectorTest, LongParameterListsAreCutInTheMessageOnly) {
  StallInspector inspector(Opts(1, 0));
  auto many = [](int) {
    std::vector<std::string> names;
    for (int i = 0; i < 20; ++i) names.push_back("p" + std::to_string(i));
    return names;
  };
  inspector.Update(10 * kMs, {LocalWait(1, 0, 0, {0})}, many, nullptr);
  const StallReport r = inspector.Current()[0];
  EXPECT_EQ(r.unready_parameters.size(), 20u);
  EXPECT_THAT(r.message, HasSubstr("'p7' and 12 more"));
}

}  // namespace
}  // namespace gradd
