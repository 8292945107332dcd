// The gRPC adapters (rpc/admin_service.h) in-process over a Unix socket,
// with a fake handler: status translation, deadlines passed through, and
// Health.Watch's stream.
#include "server/rpc/admin_service.h"

#include <stdlib.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace gradd {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

class FakeAdminHandler final : public AdminHandlerInterface {
 public:
  absl::StatusOr<v1::GetStatusResponse> GetStatus(
      const v1::GetStatusRequest&, absl::Time deadline) override {
    Record(deadline);
    v1::GetStatusResponse r;
    r.set_version("test");
    return r;
  }
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest&,
                                                absl::Time deadline) override {
    Record(deadline);
    return absl::UnavailableError("control loop hung");
  }
  absl::StatusOr<v1::GetJobResponse> GetJob(const v1::GetJobRequest& request,
                                            absl::Time deadline) override {
    Record(deadline);
    return absl::NotFoundError("no job '" + request.job_id() + "'");
  }
  absl::StatusOr<v1::GetConfigResponse> GetConfig(const v1::GetConfigRequest&,
                                                  absl::Time) override {
    return v1::GetConfigResponse();
  }
  absl::StatusOr<v1::GetTraceResponse> GetTrace(
      const v1::GetTraceRequest& request, absl::Time) override {
    v1::GetTraceResponse r;
    r.set_job_id(request.job_id());
    r.add_events()->set_phase("network");
    return r;
  }
  absl::StatusOr<HealthCheckResponse::ServingStatus> Health(
      const std::string& service, absl::Time deadline) override {
    Record(deadline);
    if (service == "unknown") return absl::NotFoundError("no such service");
    absl::MutexLock lock(&mu_);
    return serving_ ? HealthCheckResponse::SERVING
                    : HealthCheckResponse::NOT_SERVING;
  }

  void set_serving(bool serving) {
    absl::MutexLock lock(&mu_);
    serving_ = serving;
  }
  absl::Time last_deadline() {
    absl::MutexLock lock(&mu_);
    return last_deadline_;
  }

 private:
  void Record(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    last_deadline_ = deadline;
  }
  absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = true;
  absl::Time last_deadline_ ABSL_GUARDED_BY(mu_);
};

class AdminServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::gradd::testing::MakeTempDir("gradd-admin-");
    ASSERT_FALSE(dir_.empty());
    const std::string address = "unix:" + dir_ + "/s.sock";
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials());
    builder.RegisterService(&admin_);
    builder.RegisterService(&health_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    auto channel =
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    admin_stub_ = v1::Admin::NewStub(channel);
    health_stub_ = grpc::health::v1::Health::NewStub(channel);
  }
  void TearDown() override {
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(2));
      server_->Wait();
    }
    ::gradd::testing::RemoveTree(dir_);
  }
  void Deadline(grpc::ClientContext* context, absl::Duration d) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + d));
  }

  FakeAdminHandler handler_;
  AdminService admin_{&handler_};
  HealthService health_{&handler_};
  std::string dir_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Admin::Stub> admin_stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_stub_;
};

TEST_F(AdminServiceTest, ForwardsAnswersAndTheCallersDeadline) {
  grpc::ClientContext context;
  const absl::Time sent = absl::Now();
  Deadline(&context, absl::Seconds(7));
  v1::GetStatusResponse status;
  ASSERT_TRUE(
      admin_stub_->GetStatus(&context, v1::GetStatusRequest(), &status).ok());
  EXPECT_EQ(status.version(), "test");
  // gRPC carries the timeout rounded up to its wire unit.
  EXPECT_LE(handler_.last_deadline(), absl::Now() + absl::Milliseconds(7100));
  EXPECT_GT(handler_.last_deadline(), sent + absl::Seconds(5));

  grpc::ClientContext trace_context;
  Deadline(&trace_context, absl::Seconds(10));
  v1::GetTraceRequest trace_request;
  trace_request.set_job_id("j");
  v1::GetTraceResponse trace;
  ASSERT_TRUE(
      admin_stub_->GetTrace(&trace_context, trace_request, &trace).ok());
  EXPECT_EQ(trace.job_id(), "j");
  EXPECT_EQ(trace.events_size(), 1);
}

TEST_F(AdminServiceTest, HandlerErrorsKeepTheirCodeAndMessage) {
  grpc::ClientContext context;
  Deadline(&context, absl::Seconds(10));
  v1::GetJobRequest request;
  request.set_job_id("nope");
  v1::GetJobResponse response;
  grpc::Status s = admin_stub_->GetJob(&context, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("no job 'nope'"));

  grpc::ClientContext list_context;
  Deadline(&list_context, absl::Seconds(10));
  v1::ListJobsResponse jobs;
  s = admin_stub_->ListJobs(&list_context, v1::ListJobsRequest(), &jobs);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(AdminServiceTest, HealthCheck) {
  HealthCheckRequest request;
  HealthCheckResponse response;
  {
    grpc::ClientContext context;
    Deadline(&context, absl::Seconds(10));
    ASSERT_TRUE(health_stub_->Check(&context, request, &response).ok());
    EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  }
  handler_.set_serving(false);
  {
    grpc::ClientContext context;
    Deadline(&context, absl::Seconds(10));
    ASSERT_TRUE(health_stub_->Check(&context, request, &response).ok());
    EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  }
  {
    grpc::ClientContext context;
    Deadline(&context, absl::Seconds(10));
    request.set_service("unknown");
    EXPECT_EQ(health_stub_->Check(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
}

TEST_F(AdminServiceTest, WatchSendsTheStatusThenEachChange) {
  grpc::ClientContext context;
  Deadline(&context, absl::Seconds(20));
  HealthCheckRequest request;
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader =
      health_stub_->Watch(&context, request);
  HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  handler_.set_serving(false);
  ASSERT_TRUE(reader->Read(&response));  // the next probe sees the change
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  context.TryCancel();
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(AdminServiceTest, WatchOfAnUnknownServiceSaysSo) {
  grpc::ClientContext context;
  Deadline(&context, absl::Seconds(20));
  HealthCheckRequest request;
  request.set_service("unknown");
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader =
      health_stub_->Watch(&context, request);
  HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVICE_UNKNOWN);
  context.TryCancel();
  while (reader->Read(&response)) {
  }
  reader->Finish();
}

}  // namespace
}  // namespace gradd
