// Every bad input of issue 2 against the real daemon: each gets a clear
// error naming what is wrong, within a bounded time, and the daemon then
// still serves a healthy job.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/session.h"
#include "common/shm.h"
#include "gmock/gmock.h"
#include "gradd/v1/node.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace gradd::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class BadInputTest : public GraddTest {};

TEST_F(BadInputTest, DifferentModelsAcrossLocalRanks) {
  Proc r0 = SpawnTrainer("mismatch", 0, 2, {"--model", "mixed"});
  Proc r1 = SpawnTrainer("mismatch", 1, 2, {"--model", "alt"});
  for (Proc* p : {&r0, &r1}) {
    Exit e = Wait(*p, milliseconds(20000));
    EXPECT_EQ(e.code, 3) << e.output;
    // The first differing parameter (index 5, layer5.bias) and both ranks.
    EXPECT_THAT(e.output,
                AllOf(HasSubstr("ERROR code=3"), HasSubstr("layer5.bias"),
                      HasSubstr("local ranks 0 and 1"),
                      HasSubstr("local rank 0"), HasSubstr("local rank 1")));
  }
  ExpectHealthyJob("after-mismatch");
}

TEST_F(BadInputTest, DuplicateLocalRank) {
  std::vector<Proc> ps = {SpawnTrainer("dup", 0, 2, {"--iterations", "5"}),
                          SpawnTrainer("dup", 0, 2, {"--iterations", "5"})};
  // Whichever arrives second is refused at once, naming the rank.
  Exit refused;
  int who = WaitAny(ps, milliseconds(10000), &refused);
  ASSERT_GE(who, 0) << "neither duplicate was refused";
  EXPECT_EQ(refused.code, 3) << refused.output;
  EXPECT_THAT(refused.output,
              AllOf(HasSubstr("ERROR code=6"), HasSubstr("local rank 0"),
                    HasSubstr("already attached")));
  // The first one keeps its place: with rank 1 the job runs normally.
  Proc r1 = SpawnTrainer("dup", 1, 2, {"--iterations", "5"});
  for (Proc* p : {&ps[1 - who], &r1}) {
    Exit e = Wait(*p, milliseconds(20000));
    EXPECT_EQ(e.code, 0) << e.output;
    EXPECT_THAT(e.output, HasSubstr("PASS"));
  }
  ExpectHealthyJob("after-dup");
}

TEST_F(BadInputTest, OutOfRangeLocalRank) {
  Proc p = SpawnTrainer("range", 2, 2);
  Exit e = Wait(p, milliseconds(10000));
  EXPECT_EQ(e.code, 3) << e.output;
  EXPECT_THAT(e.output,
              AllOf(HasSubstr("ERROR code=3"), HasSubstr("local rank 2"),
                    HasSubstr("out of range")));
  ExpectHealthyJob("after-range");
}

TEST_F(BadInputTest, ParameterMarkedReadyTwice) {
  std::vector<Exit> exits =
      RunJob("twice", 2, {"--iterations", "4", "--mode", "double_mark"},
             milliseconds(20000));
  for (const Exit& e : exits) {
    // The second mark fails, names the parameter the DDP way, and does not
    // count: the iteration still completes with exact averages.
    EXPECT_EQ(e.code, 0) << e.output;
    EXPECT_THAT(e.output,
                AllOf(HasSubstr("EXPECTED_ERROR code=9 parameter 'layer"),
                      HasSubstr("marked ready twice in iteration 2"),
                      HasSubstr("PASS iterations=4")));
  }
  ExpectHealthyJob("after-twice");
}

TEST_F(BadInputTest, UnknownParameterIndex) {
  std::vector<Exit> exits =
      RunJob("unknown", 2, {"--iterations", "3", "--mode", "unknown_index"},
             milliseconds(20000));
  for (const Exit& e : exits) {
    EXPECT_EQ(e.code, 0) << e.output;
    EXPECT_THAT(e.output,
                AllOf(HasSubstr("EXPECTED_ERROR code=11 MarkReady(24)"),
                      HasSubstr("EXPECTED_ERROR code=11 MarkReady(-1)"),
                      HasSubstr("PASS iterations=3")));
  }
  ExpectHealthyJob("after-unknown");
}

TEST_F(BadInputTest, WaitAllNamesUnmarkedParameters) {
  std::vector<Exit> exits =
      RunJob("unmarked", 2, {"--iterations", "3", "--mode", "unmarked"},
             milliseconds(20000));
  for (const Exit& e : exits) {
    EXPECT_EQ(e.code, 0) << e.output;
    EXPECT_THAT(e.output,
                AllOf(HasSubstr("EXPECTED_ERROR code=9 1 of 24 parameters were "
                                "not marked ready in iteration 2"),
                      HasSubstr("'layer"), HasSubstr("PASS iterations=3")));
  }
}

// Sends what no client library would: a raw Attach with dtype 99.
TEST_F(BadInputTest, UnsupportedDtype) {
  const std::string session_path = SessionSocketPath(socket_);
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(fd.valid());
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, session_path.data(), session_path.size());
  ASSERT_EQ(connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
            0)
      << std::strerror(errno);
  auto hello_msg = ReceiveWithFds(fd.get(), sizeof(SessionHello), 0,
                                  std::chrono::milliseconds(5000));
  ASSERT_TRUE(hello_msg.ok()) << hello_msg.status();
  ASSERT_EQ(hello_msg->payload.size(), sizeof(SessionHello));
  SessionHello hello;
  std::memcpy(&hello, hello_msg->payload.data(), sizeof(hello));

  auto stub = v1::Node::NewStub(grpc::CreateChannel(
      "unix:" + socket_, grpc::InsecureChannelCredentials()));
  v1::AttachRequest request;
  request.set_job_id("dtype");
  request.set_local_rank(0);
  request.set_local_world_size(1);
  request.set_session_id(hello.session_id);
  v1::ParamSpec* ok = request.add_params();
  ok->set_name("fine");
  ok->add_shape(4);
  ok->set_dtype(v1::FLOAT32);
  v1::ParamSpec* bad = request.add_params();
  bad->set_name("weird");
  bad->add_shape(4);
  bad->set_dtype(static_cast<v1::DType>(99));
  v1::AttachResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  grpc::Status s = stub->Attach(&context, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("dtype"), HasSubstr("99"), HasSubstr("'weird'")));
  ExpectHealthyJob("after-dtype");
}

// Issue 11: a session id learned by another process (same uid) must not let
// it attach or detach in the owner's place.
TEST_F(BadInputTest, SessionOfAnotherProcessIsRefused) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const std::string session_path = SessionSocketPath(socket_);
  const pid_t owner = fork();
  ASSERT_GE(owner, 0);
  if (owner == 0) {
    // The session's owner: connect, read the hello, hand its id over, wait.
    close(pipe_fds[0]);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, session_path.data(), session_path.size());
    SessionHello hello;
    if (fd < 0 ||
        connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        recv(fd, &hello, sizeof(hello), 0) != sizeof(hello) ||
        write(pipe_fds[1], &hello.session_id, sizeof(hello.session_id)) !=
            sizeof(hello.session_id)) {
      _exit(1);
    }
    pause();
    _exit(0);
  }
  close(pipe_fds[1]);
  uint64_t session_id = 0;
  ASSERT_EQ(read(pipe_fds[0], &session_id, sizeof(session_id)),
            static_cast<ssize_t>(sizeof(session_id)));
  close(pipe_fds[0]);

  auto stub = v1::Node::NewStub(grpc::CreateChannel(
      "unix:" + socket_, grpc::InsecureChannelCredentials()));
  v1::AttachRequest request;
  request.set_job_id("stolen");
  request.set_local_rank(0);
  request.set_local_world_size(1);
  request.set_session_id(session_id);
  v1::ParamSpec* p = request.add_params();
  p->set_name("w");
  p->add_shape(4);
  p->set_dtype(v1::FLOAT32);
  v1::AttachResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  grpc::Status s = stub->Attach(&context, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << s.error_message();
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr(absl::StrCat("belongs to pid ", owner)),
                    HasSubstr(absl::StrCat("came from pid ", getpid()))));

  v1::DetachRequest detach;
  detach.set_job_id("stolen");
  detach.set_local_rank(0);
  detach.set_session_id(session_id);
  v1::DetachResponse detached;
  grpc::ClientContext detach_context;
  detach_context.set_deadline(std::chrono::system_clock::now() +
                              std::chrono::seconds(10));
  s = stub->Detach(&detach_context, detach, &detached);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << s.error_message();

  kill(owner, SIGKILL);
  waitpid(owner, nullptr, 0);
  ExpectHealthyJob("after-stolen-session");
}

TEST_F(BadInputTest, NoDaemonAtSocket) {
  const std::string missing = dir_ + "/nobody/gradd.sock";
  Proc p = Spawn("nodaemon", {GRADD_TEST_TRAINER, "--socket", missing,
                              "--connect-timeout-ms", "1000"});
  Exit e = Wait(p, milliseconds(10000));
  EXPECT_EQ(e.code, 3) << e.output;
  EXPECT_THAT(e.output, AllOf(HasSubstr("ERROR code=14"),
                              HasSubstr("no gradd daemon at " + missing)));
  // Bounded: it retried for the connect timeout, then gave up.
  EXPECT_GE(e.elapsed.count(), 900);
  EXPECT_LT(e.elapsed.count(), 4000);
}

// A rank that never comes: Attach ends by its deadline naming who is
// missing, instead of waiting forever.
TEST_F(BadInputTest, MissingRankTimesOut) {
  Proc p = SpawnTrainer("missing", 0, 2, {"--attach-timeout-ms", "1500"});
  Exit e = Wait(p, milliseconds(10000));
  EXPECT_EQ(e.code, 3) << e.output;
  // Either the daemon's answer (naming local rank 1 as missing) or, when
  // the call's deadline wins the race, the client's.
  EXPECT_THAT(e.output,
              AllOf(HasSubstr("ERROR code=4"), HasSubstr("job 'missing'"),
                    HasSubstr("local world size 2")));
  EXPECT_LT(e.elapsed.count(), 5000);
  ExpectHealthyJob("missing");  // the same job id attaches afresh
}

TEST_F(BadInputTest, TrainerKilledMidIteration) {
  Proc r0 = SpawnTrainer("killed", 0, 2, {"--iterations", "1000000"});
  Proc r1 = SpawnTrainer(
      "killed", 1, 2,
      {"--iterations", "1000000", "--mode", "stall", "--stall-at", "3"});
  ASSERT_TRUE(WaitForText(r1, "STALLED", milliseconds(20000)))
      << ReadFile(r1.log);
  // Let rank 0 reach its WaitAll for the stalled iteration.
  std::this_thread::sleep_for(milliseconds(100));
  ASSERT_EQ(kill(r1.pid, SIGKILL), 0);
  Exit e = Wait(r0, milliseconds(10000));
  EXPECT_EQ(e.code, 3) << e.output;
  EXPECT_THAT(e.output,
              AllOf(HasSubstr("ERROR code="), HasSubstr("local rank 1"),
                    HasSubstr("iteration 3")));
  EXPECT_LT(e.elapsed.count(), 5000) << "the survivor waited too long";
  RecordProperty("survivor_error_ms", static_cast<int>(e.elapsed.count()));
  std::cout << "survivor got its error " << e.elapsed.count()
            << " ms after the kill\n";
  Wait(r1, milliseconds(1000));
  ExpectHealthyJob("after-kill");
}

}  // namespace
}  // namespace gradd::testing
