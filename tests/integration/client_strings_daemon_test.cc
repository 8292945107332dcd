// Issue 20, point 6, against the real daemon: every string a client sends
// (job ids, parameter and node ids, hook names, ...) that is not UTF-8, holds
// a control character or is over its length limit is refused with
// INVALID_ARGUMENT naming the field, nothing a client sends can write a line
// of its own into the daemon's log, and a process of the daemon's own uid
// cannot open the daemon's memory through /proc.
//
// The requests are raw gRPC calls (the client library refuses these strings
// before sending: tests/unit/client_api/client_strings_check_test.cc).
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/session.h"
#include "common/shm.h"
#include "common/unix_socket.h"
#include "gmock/gmock.h"
#include "gradd/v1/admin.grpc.pb.h"
#include "gradd/v1/node.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace gradd::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// A line the daemon writes: "2026-12-01T11:30:00.123456Z I gradd: ...".
const std::regex kLinePattern(
    R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z [TDIWEC] gradd: .+)");
// What an attacker would like an operator to read.
constexpr char kForged[] =
    "2030-01-01T00:00:00.000000Z I gradd: job 'payroll' formed: 2 local ranks";

class ClientStringsDaemonTest : public GraddTest {
 protected:
  void SetUp() override {
    GraddTest::SetUp();
    channel_ = grpc::CreateChannel("unix:" + socket_,
                                   grpc::InsecureChannelCredentials());
    node_ = v1::Node::NewStub(channel_);
  }

  // Connects a session as a trainer does; its id (0 with a failure).
  uint64_t OpenSession() {
    absl::StatusOr<UniqueFd> fd = UnixSocket(SOCK_SEQPACKET);
    if (!fd.ok()) {
      ADD_FAILURE() << fd.status();
      return 0;
    }
    std::optional<sockaddr_un> addr = UnixAddress(SessionSocketPath(socket_));
    if (!addr.has_value() || ConnectUnix(fd->get(), *addr) != 0) {
      ADD_FAILURE() << "cannot connect to " << SessionSocketPath(socket_);
      return 0;
    }
    absl::StatusOr<ReceivedMessage> hello_msg = ReceiveWithFds(
        fd->get(), sizeof(SessionHello), 0, std::chrono::milliseconds(5000));
    if (!hello_msg.ok() || hello_msg->payload.size() != sizeof(SessionHello)) {
      ADD_FAILURE() << "no session hello";
      return 0;
    }
    SessionHello hello;
    std::memcpy(&hello, hello_msg->payload.data(), sizeof(hello));
    sessions_.push_back(*std::move(fd));
    return hello.session_id;
  }

  // A well-formed single-rank attach on a fresh session.
  v1::AttachRequest GoodAttach(const std::string& job) {
    v1::AttachRequest request;
    request.set_job_id(job);
    request.set_local_rank(0);
    request.set_local_world_size(1);
    request.set_session_id(OpenSession());
    for (const char* name : {"w", "b"}) {
      v1::ParamSpec* p = request.add_params();
      p->set_name(name);
      p->add_shape(4);
      p->set_dtype(v1::FLOAT32);
    }
    return request;
  }

  grpc::Status Attach(const v1::AttachRequest& request) {
    v1::AttachResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    return node_->Attach(&context, request, &response);
  }

  // Every line of the daemon's log so far is one of its own lines, and none
  // is the forged one.
  void ExpectLogIntact() {
    const std::string log = ReadFile(daemon_.log);
    for (absl::string_view line :
         absl::StrSplit(log, '\n', absl::SkipEmpty())) {
      EXPECT_TRUE(std::regex_match(line.begin(), line.end(), kLinePattern))
          << "not a line of gradd's: " << line;
    }
    EXPECT_THAT(log, Not(HasSubstr(std::string("\n") + kForged)));
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Node::Stub> node_;
  std::vector<UniqueFd> sessions_;
};

// The attack of the issue: a job id carrying a newline and a line of the
// daemon's log format. It is refused naming job_id, and the log still holds
// only the daemon's own lines.
TEST_F(ClientStringsDaemonTest, NewlineInJobIdIsRefusedAndForgesNoLogLine) {
  v1::AttachRequest request = GoodAttach(absl::StrCat("evil\n", kForged));
  grpc::Status s = Attach(request);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr("AttachRequest.job_id"),
                                       HasSubstr("control character U+000A")));

  // Detach is logged by the engine as well.
  v1::DetachRequest detach;
  detach.set_job_id(absl::StrCat("evil\n", kForged));
  detach.set_session_id(request.session_id());
  v1::DetachResponse detached;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  s = node_->Detach(&context, detach, &detached);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("DetachRequest.job_id"));

  ExpectHealthyJob("after-newline");
  ExpectLogIntact();
}

// Invalid UTF-8 in a parameter name: protobuf refuses to parse the request,
// which gRPC answers INTERNAL with an empty message unless the daemon says
// which field it was.
TEST_F(ClientStringsDaemonTest, InvalidUtf8ParameterNameNamesTheField) {
  v1::AttachRequest request = GoodAttach("utf8");
  request.mutable_params(1)->set_name("bias\xff\xfe");
  grpc::Status s = Attach(request);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("AttachRequest.params[1].name"),
                    HasSubstr("not valid UTF-8"), HasSubstr("0xFF")));

  v1::AttachRequest job = GoodAttach("utf8-job\xc3\x28");
  s = Attach(job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr("AttachRequest.job_id"),
                                       HasSubstr("not valid UTF-8")));

  // The admin service: the same for GetJob.
  auto admin = v1::Admin::NewStub(channel_);
  v1::GetJobRequest get;
  get.set_job_id("x\x80");
  v1::GetJobResponse got;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  s = admin->GetJob(&context, get, &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("GetJobRequest.job_id"));

  ExpectHealthyJob("after-utf8");
  ExpectLogIntact();
}

TEST_F(ClientStringsDaemonTest, ControlCharactersAnywhereAreRefused) {
  struct Case {
    std::string field;
    void (*set)(v1::AttachRequest*);
  };
  const std::vector<Case> cases = {
      {"AttachRequest.params[0].name",
       [](v1::AttachRequest* r) { r->mutable_params(0)->set_name("w\r"); }},
      {"AttachRequest.node_id",
       [](v1::AttachRequest* r) { r->set_node_id("node\x1b[31m"); }},
      {"AttachRequest.coordinator",
       [](v1::AttachRequest* r) { r->set_coordinator("host\t:29600"); }},
      {"AttachRequest.comm_hook.name",
       [](v1::AttachRequest* r) {
         r->mutable_comm_hook()->set_name(std::string("fp16\0x", 6));
       }},
      // C1 controls and the Unicode line separator end lines too.
      {"AttachRequest.params[1].name",
       [](v1::AttachRequest* r) {
         r->mutable_params(1)->set_name("b\xc2\x85");
       }},
      {"AttachRequest.job_id",
       [](v1::AttachRequest* r) { r->set_job_id("j\xe2\x80\xa8"); }},
  };
  for (const Case& c : cases) {
    v1::AttachRequest request = GoodAttach("controls");
    c.set(&request);
    grpc::Status s = Attach(request);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.field << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.field));
  }
  ExpectHealthyJob("after-controls");
  ExpectLogIntact();
}

TEST_F(ClientStringsDaemonTest, OverLongStringsAreRefusedWithTheLimit) {
  v1::AttachRequest request = GoodAttach("long");
  request.mutable_params(0)->set_name(std::string(5000, 'p'));
  grpc::Status s = Attach(request);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("AttachRequest.params[0].name"),
                    HasSubstr("5000 bytes"), HasSubstr("4096")));

  v1::AttachRequest job = GoodAttach(std::string(300, 'j'));
  s = Attach(job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("AttachRequest.job_id"), HasSubstr("300 bytes"),
                    HasSubstr("256")));

  v1::CommHookSetRequest hook;
  hook.set_job_id("long");
  hook.set_session_id(job.session_id());
  hook.mutable_hook()->set_name(std::string(100, 'h'));
  v1::CommHookSetResponse hooked;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  s = node_->SetCommHook(&context, hook, &hooked);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("CommHookSetRequest.hook.name"));
  ExpectHealthyJob("after-long");
}

// Non-ASCII text that is valid UTF-8 is a name like any other.
TEST_F(ClientStringsDaemonTest, Utf8NamesAreServed) {
  v1::AttachRequest request = GoodAttach("utf8-ok");
  request.mutable_params(0)->set_name("couche.poids\xc3\xa9");
  request.mutable_params(1)->set_name("\xe5\xb1\x82.bias");
  grpc::Status s = Attach(request);
  EXPECT_TRUE(s.ok()) << s.error_message();
  ExpectLogIntact();
}

// PR_SET_DUMPABLE 0: a process of the daemon's uid cannot open the daemon's
// memory through /proc, while it can open that of another process of its
// uid that did not opt out (the control, so that the check can fail).
//
// Run as root, the test would pass for the wrong reason: opening another
// process's memory needs CAP_SYS_PTRACE unless the opener's capabilities
// cover the target's. So a child drops every capability (bounding set
// included, so that exec does not give them back) and starts a second
// daemon and the control process itself: all three then have none, and
// only the daemon's non-dumpable flag is left to refuse.
TEST_F(ClientStringsDaemonTest, SameUidProcessCannotOpenDaemonMemory) {
  // Everything the child needs, prepared before fork (no allocation there).
  const std::string socket = dir_ + "/proc-check.sock";
  const std::string log = dir_ + "/proc-check.log";
  const std::string binary = DaemonBinary();
  std::vector<char*> argv = {const_cast<char*>(binary.c_str()),
                             const_cast<char*>("--socket"),
                             const_cast<char*>(socket.c_str()), nullptr};
  char mem_path[64];
  char control_path[64];
  enum : int {
    kAsExpected = 0,
    kControlRefused = 10,
    kDaemonOpened = 11,
    kSetupFailed = 12,
  };

  const pid_t child = fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    for (int cap = 0; cap <= CAP_LAST_CAP; ++cap) {
      prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);  // EPERM unless root: fine
    }
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3] = {};
    if (syscall(SYS_capset, &header, none) != 0) _exit(kSetupFailed);
    const pid_t control = fork();
    if (control == 0) {
      pause();
      _exit(0);
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t daemon = -1;
    if (control < 0 || posix_spawn(&daemon, binary.c_str(), &actions, nullptr,
                                   argv.data(), environ) != 0) {
      _exit(kSetupFailed);
    }
    struct stat st;
    for (int i = 0; i < 1000 && stat(socket.c_str(), &st) != 0; ++i) {
      usleep(10000);
    }
    snprintf(control_path, sizeof(control_path), "/proc/%d/mem", control);
    snprintf(mem_path, sizeof(mem_path), "/proc/%d/mem", daemon);
    int code = kAsExpected;
    const int control_fd = open(control_path, O_RDWR | O_CLOEXEC);
    const int daemon_fd = open(mem_path, O_RDWR | O_CLOEXEC);
    if (stat(socket.c_str(), &st) != 0) {
      code = kSetupFailed;
    } else if (control_fd < 0) {
      code = kControlRefused;
    } else if (daemon_fd >= 0) {
      code = kDaemonOpened;
    }
    kill(control, SIGKILL);
    kill(daemon, SIGKILL);
    waitpid(control, nullptr, 0);
    waitpid(daemon, nullptr, 0);
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  switch (WEXITSTATUS(status)) {
    case kAsExpected:
      break;
    case kControlRefused:
      GTEST_SKIP() << "this kernel refuses a same-uid process's memory even "
                      "when it is dumpable (a ptrace policy such as Yama): "
                      "the daemon's flag cannot be told apart";
    case kDaemonOpened:
      ADD_FAILURE() << "a process of the daemon's uid opened its /proc/<pid>/"
                       "mem read-write";
      break;
    default:
      ADD_FAILURE() << "the check could not run (exit " << WEXITSTATUS(status)
                    << "); daemon log:\n"
                    << ReadFile(log);
  }
}

}  // namespace
}  // namespace gradd::testing
