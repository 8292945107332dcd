// graddctl: the admin CLI of a gradd daemon (usage and exit codes in
// args.h; output formats in format.h and trace.h). One RPC per command,
// bounded by --timeout, over the daemon's Unix socket.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/session.h"
#include "gradd/v1/admin.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tools/graddctl/args.h"
#include "tools/graddctl/format.h"
#include "tools/graddctl/trace.h"

namespace gradd::ctl {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

class Ctl {
 public:
  explicit Ctl(const Options& options) : o_(options) {
    grpc::ChannelArguments args;
    // The daemon's answers can be large (a job with 100k parameters).
    args.SetMaxReceiveMessageSize(256 << 20);
    channel_ =
        grpc::CreateCustomChannel(absl::StrCat("unix:", o_.socket),
                                  grpc::InsecureChannelCredentials(), args);
  }

  int Run() {
    switch (o_.command) {
      case Command::kStatus:
        return Call<v1::GetStatusRequest, v1::GetStatusResponse>(
            &v1::Admin::Stub::GetStatus, {},
            [](const auto& r) { return FormatStatus(r); });
      case Command::kJobs:
        return Call<v1::ListJobsRequest, v1::ListJobsResponse>(
            &v1::Admin::Stub::ListJobs, {},
            [](const auto& r) { return FormatJobs(r); });
      case Command::kJob: {
        v1::GetJobRequest req;
        req.set_job_id(o_.job_id);
        return Call<v1::GetJobRequest, v1::GetJobResponse>(
            &v1::Admin::Stub::GetJob, req,
            [](const auto& r) { return FormatJob(r.job()); });
      }
      case Command::kConfig:
        return Call<v1::GetConfigRequest, v1::GetConfigResponse>(
            &v1::Admin::Stub::GetConfig, {},
            [](const auto& r) { return r.text() + "\n"; },
            [](const auto& r) { return ToJson(r.config()); });
      case Command::kHealth:
        return Health();
      case Command::kTrace:
        return Trace();
      case Command::kHelp:
        break;
    }
    std::cout << Usage();
    return kExitOk;
  }

 private:
  void SetDeadline(grpc::ClientContext* context) const {
    context->set_deadline(absl::ToChronoTime(absl::Now() + o_.timeout));
  }

  int Fail(const grpc::Status& status) const {
    const int code = ExitCodeFor(status);
    if (code == kExitUnreachable &&
        status.error_code() != grpc::StatusCode::UNAVAILABLE) {
      std::cerr << "graddctl: no answer from gradd at " << o_.socket
                << " within " << absl::FormatDuration(o_.timeout) << "\n";
    } else if (code == kExitUnreachable) {
      std::cerr << "graddctl: cannot reach gradd at " << o_.socket << ": "
                << status.error_message() << "\n";
    } else {
      std::cerr << "graddctl: " << status.error_message() << "\n";
    }
    return code;
  }

  template <typename Request, typename Response, typename Method,
            typename Human>
  int Call(Method method, const Request& request, Human human) {
    return Call<Request, Response>(method, request, human,
                                   [](const Response& r) { return ToJson(r); });
  }

  template <typename Request, typename Response, typename Method,
            typename Human, typename Json>
  int Call(Method method, const Request& request, Human human, Json json) {
    std::unique_ptr<v1::Admin::Stub> stub = v1::Admin::NewStub(channel_);
    grpc::ClientContext context;
    SetDeadline(&context);
    Response response;
    grpc::Status status = ((*stub).*method)(&context, request, &response);
    if (!status.ok()) return Fail(status);
    std::cout << (o_.json ? json(response) : human(response));
    return kExitOk;
  }

  int Health() {
    std::unique_ptr<grpc::health::v1::Health::Stub> stub =
        grpc::health::v1::Health::NewStub(channel_);
    grpc::ClientContext context;
    SetDeadline(&context);
    HealthCheckRequest request;
    request.set_service(o_.service);
    HealthCheckResponse response;
    grpc::Status status = stub->Check(&context, request, &response);
    if (!status.ok()) return Fail(status);
    std::cout << (o_.json ? ToJson(response) : FormatHealth(response.status()));
    return response.status() == HealthCheckResponse::SERVING ? kExitOk
                                                             : kExitError;
  }

  int Trace() {
    std::unique_ptr<v1::Admin::Stub> stub = v1::Admin::NewStub(channel_);
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::GetTraceRequest request;
    request.set_job_id(o_.job_id);
    v1::GetTraceResponse response;
    grpc::Status status = stub->GetTrace(&context, request, &response);
    if (!status.ok()) return Fail(status);
    const std::string text = ChromeTraceJson(response);
    if (o_.out == "-") {
      std::cout << text;
    } else {
      // Written whole under a temporary name, then renamed: a reader never
      // sees half a trace.
      const std::string tmp = o_.out + ".tmp";
      {
        std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
        file << text;
        file.close();
        if (!file) {
          std::cerr << "graddctl: cannot write " << tmp << "\n";
          std::remove(tmp.c_str());
          return kExitError;
        }
      }
      if (std::rename(tmp.c_str(), o_.out.c_str()) != 0) {
        std::cerr << "graddctl: cannot rename " << tmp << " to " << o_.out
                  << "\n";
        std::remove(tmp.c_str());
        return kExitError;
      }
    }
    // The summary goes where it does not mix with a trace on stdout.
    std::ostream& summary = o_.out == "-" ? std::cerr : std::cout;
    if (o_.json) {
      summary << "{\"job_id\":" << JsonString(response.job_id())
              << ",\"out\":" << JsonString(o_.out)
              << ",\"events\":" << response.events_size()
              << ",\"note\":" << JsonString(response.note()) << "}\n";
    } else {
      summary << "wrote " << response.events_size() << " events of job "
              << response.job_id() << " to " << o_.out << "\n";
      if (!response.note().empty())
        summary << "note: " << response.note() << "\n";
    }
    return kExitOk;
  }

  const Options o_;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace
}  // namespace gradd::ctl

int main(int argc, char** argv) {
  using namespace gradd::ctl;
  std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<Options> options = ParseArgs(args, gradd::ClientSocketPath());
  if (!options.ok()) {
    std::cerr << "graddctl: " << options.status().message() << "\n" << Usage();
    return kExitUsage;
  }
  return Ctl(*options).Run();
}
