// The Attach checks that need only the requests and the daemon's config
// (server/engine/manager/attach_validation.h): one request against the
// limits, and every local rank's request against local rank 0's once the
// job's ranks are all there, each disagreement named with both ranks.
#include "server/engine/manager/attach_validation.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config.h"
#include "tests/unit/engine/manager/test_rank.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr size_t kMiB = size_t{1} << 20;

class AttachValidationTest : public ::testing::Test {
 protected:
  void SetUp() override { config_ = DefaultConfig(); }

  v1::AttachRequest Request(int rank) {
    return MakeRequest("job", rank, 2, 100 + rank,
                       {{"w", {4, 8}}, {"b", {8}, v1::FLOAT16}});
  }
  std::vector<ParamInfo> Params(const v1::AttachRequest& request) {
    absl::StatusOr<std::vector<ParamInfo>> params =
        ValidateAttachRequest(request, config_);
    EXPECT_TRUE(params.ok()) << params.status();
    return params.ok() ? *params : std::vector<ParamInfo>{};
  }
  absl::Status Compare(const v1::AttachRequest& a, const v1::AttachRequest& b) {
    return CompareLocalAttach("job", 1, a, Params(a), b, Params(b), config_);
  }

  v1::DaemonConfig config_;
};

TEST_F(AttachValidationTest, AValidRequestGivesItsParametersInPlannerForm) {
  v1::AttachRequest request = Request(0);
  request.mutable_params(1)->set_device(v1::DEVICE_CUDA);
  request.mutable_cuda_device()->set_uuid(std::string(16, '\x01'));
  absl::StatusOr<std::vector<ParamInfo>> params =
      ValidateAttachRequest(request, config_);
  ASSERT_TRUE(params.ok()) << params.status();
  ASSERT_EQ(params->size(), 2u);
  EXPECT_EQ((*params)[0].name, "w");
  EXPECT_EQ((*params)[0].shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ((*params)[0].dtype, DType::kFloat32);
  EXPECT_EQ((*params)[0].device, DeviceKind::kCpu);
  EXPECT_EQ((*params)[1].dtype, DType::kFloat16);
  EXPECT_EQ((*params)[1].device, DeviceKind::kCuda);
}

TEST_F(AttachValidationTest, RequestsOutsideTheLimitsAreNamed) {
  v1::AttachRequest bad_id = Request(0);
  bad_id.set_job_id("job\n1");
  EXPECT_THAT(ValidateAttachRequest(bad_id, config_).status().message(),
              HasSubstr("contains '\\n'"));

  v1::AttachRequest bad_rank = Request(0);
  bad_rank.set_local_rank(2);
  EXPECT_THAT(ValidateAttachRequest(bad_rank, config_).status().message(),
              HasSubstr("local rank 2 is out of range for local world size 2"));

  v1::AttachRequest too_many = Request(1);
  config_.set_max_params(1);
  absl::Status s = ValidateAttachRequest(too_many, config_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("local rank 1 of job 'job'"),
                                 HasSubstr("registered 2 parameters")));
}

TEST_F(AttachValidationTest, NumNodesCountsAnUnsetOneAsOneNode) {
  v1::AttachRequest request = Request(0);
  EXPECT_EQ(NumNodes(request), 1);
  request.set_num_nodes(3);
  EXPECT_EQ(NumNodes(request), 3);
}

TEST_F(AttachValidationTest, RanksThatAskForTheSameJobAgree) {
  EXPECT_TRUE(Compare(Request(0), Request(1)).ok());
  // A cap left at 0 is the daemon's default: the same as asking for it.
  v1::AttachRequest explicit_caps = Request(1);
  explicit_caps.set_bucket_cap_mb(config_.bucket_cap_mb());
  explicit_caps.set_first_bucket_cap_mb(config_.first_bucket_cap_mb());
  EXPECT_TRUE(Compare(Request(0), explicit_caps).ok());
  // An unset hook is allreduce.
  v1::AttachRequest allreduce = Request(1);
  allreduce.mutable_comm_hook()->set_name("allreduce");
  EXPECT_TRUE(Compare(Request(0), allreduce).ok());
}

TEST_F(AttachValidationTest, EachDisagreementIsNamedWithBothRanks) {
  v1::AttachRequest other_model = Request(1);
  other_model.mutable_params(0)->set_shape(1, 9);
  absl::Status s = Compare(Request(0), other_model);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      s.message(),
      AllOf(HasSubstr("local ranks 0 and 1 of job 'job' registered "
                      "different models"),
            HasSubstr("parameter 0 is 'w' [4, 8] float32 on local "
                      "rank 0 but 'w' [4, 9] float32 on local rank 1")));

  v1::AttachRequest other_caps = Request(1);
  other_caps.set_bucket_cap_mb(5);
  EXPECT_THAT(Compare(Request(0), other_caps).message(),
              HasSubstr("local ranks 0 and 1 of job 'job' asked for different "
                        "bucket caps (0/0 MiB vs 5/0 MiB)"));

  v1::AttachRequest other_hook = Request(1);
  other_hook.mutable_comm_hook()->set_name("fp16_compress");
  EXPECT_THAT(Compare(Request(0), other_hook).message(),
              AllOf(HasSubstr("asked for different communication hooks"),
                    HasSubstr("fp16_compress")));

  v1::AttachRequest other_area = Request(1);
  other_area.set_broadcast_bytes(64);
  EXPECT_THAT(Compare(Request(0), other_area).message(),
              HasSubstr("asked for different broadcast areas (0 vs 64 "
                        "bytes)"));
}

TEST_F(AttachValidationTest, TheModelIsComparedFirst) {
  v1::AttachRequest both = Request(1);
  both.mutable_params(1)->set_name("c");
  both.set_broadcast_bytes(64);
  EXPECT_THAT(Compare(Request(0), both).message(),
              HasSubstr("registered different models"));
}

TEST_F(AttachValidationTest, TheMultiNodeSetupMustMatch) {
  v1::AttachRequest a = Request(0);
  a.set_num_nodes(2);
  a.set_coordinator("10.0.0.1:29400");
  v1::AttachRequest b = a;
  b.set_local_rank(1);
  EXPECT_TRUE(CompareNodeSetup("job", 1, a, b).ok());
  b.set_node_rank(1);
  absl::Status s = CompareNodeSetup("job", 1, a, b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("local ranks 0 and 1 of job 'job' disagree on "
                              "the multi-node setup"),
                    HasSubstr("node rank auto"), HasSubstr("node rank 1")));
}

TEST_F(AttachValidationTest, MinNodesIsAtMostTheJobsNodes) {
  v1::AttachRequest r = Request(0);
  r.set_num_nodes(3);
  r.set_min_nodes(3);
  EXPECT_TRUE(ValidateAttachRequest(r, config_).ok());
  r.set_min_nodes(4);
  absl::Status s = ValidateAttachRequest(r, config_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("local rank 0 of job 'job'"),
                    HasSubstr("min_nodes 4 is above the job's num_nodes 3")));
  // A single-node job has no nodes to lose: min_nodes is ignored.
  r.set_num_nodes(1);
  EXPECT_TRUE(ValidateAttachRequest(r, config_).ok());
  EXPECT_EQ(EffectiveMinNodes(r, config_), 0);
}

TEST_F(AttachValidationTest, MinNodesIsTheJobsOrTheDaemonsDefault) {
  v1::AttachRequest r = Request(0);
  r.set_num_nodes(3);
  EXPECT_EQ(EffectiveMinNodes(r, config_), 0);  // default: not elastic
  config_.set_min_nodes(2);
  EXPECT_EQ(EffectiveMinNodes(r, config_), 2);
  r.set_min_nodes(0);  // the job's own wins, 0 included
  EXPECT_EQ(EffectiveMinNodes(r, config_), 0);
  r.clear_min_nodes();
  r.set_num_nodes(2);
  config_.set_min_nodes(5);  // a default above the job: all of its nodes
  EXPECT_EQ(EffectiveMinNodes(r, config_), 2);
  r.set_num_nodes(0);
  EXPECT_EQ(EffectiveMinNodes(r, config_), 0);

  EXPECT_FALSE(IsReformableAcrossNodes(1, 0, 5000));
  EXPECT_FALSE(IsReformableAcrossNodes(1, 1, 0));
  EXPECT_FALSE(IsReformableAcrossNodes(3, 0, 0));
  EXPECT_TRUE(IsReformableAcrossNodes(3, 2, 0));
  EXPECT_TRUE(IsReformableAcrossNodes(3, 0, 5000));
}

TEST_F(AttachValidationTest, LocalRanksMustAgreeOnTheElasticSettings) {
  v1::AttachRequest a = Request(0);
  a.set_num_nodes(3);
  v1::AttachRequest b = Request(1);
  b.set_num_nodes(3);
  EXPECT_TRUE(Compare(a, b).ok());
  config_.set_min_nodes(2);
  b.set_min_nodes(2);  // the same as the default rank 0 takes
  EXPECT_TRUE(Compare(a, b).ok());
  b.set_min_nodes(1);
  absl::Status s = Compare(a, b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("local ranks 0 and 1 of job 'job' asked for different "
                        "min_nodes (2 (the daemon's default) vs 1)"));

  b.set_min_nodes(2);
  b.set_divide_by_initial_world_size(true);
  EXPECT_THAT(Compare(a, b).message(),
              HasSubstr("local ranks 0 and 1 of job 'job' asked for different "
                        "divide_by_initial_world_size (false vs true)"));
  // One node: neither setting means anything, so neither is compared.
  a.set_num_nodes(1);
  b.set_num_nodes(1);
  b.set_min_nodes(1);
  EXPECT_TRUE(Compare(a, b).ok());
}

TEST_F(AttachValidationTest, PlannerCapsAreTheRequestsOrTheDaemonsDefaults) {
  config_.set_bucket_cap_mb(25);
  config_.set_first_bucket_cap_mb(1);
  PlannerOptions defaults = PlannerOptionsFor(Request(0), config_);
  EXPECT_EQ(defaults.bucket_cap_bytes, 25 * kMiB);
  EXPECT_EQ(defaults.first_bucket_cap_bytes, 1 * kMiB);

  v1::AttachRequest asked = Request(0);
  asked.set_bucket_cap_mb(0.5);
  asked.set_first_bucket_cap_mb(2);
  PlannerOptions own = PlannerOptionsFor(asked, config_);
  EXPECT_EQ(own.bucket_cap_bytes, kMiB / 2);
  EXPECT_EQ(own.first_bucket_cap_bytes, 2 * kMiB);
}

}  // namespace
}  // namespace gradd
