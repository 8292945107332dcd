// Issue 20, point 5, against the real daemon: Attach calls that wait for the
// other local ranks of their job hold no thread of the daemon's (4,000 of
// them leave it with its usual handful of threads and idle CPU), an Attach
// its client cancels gives its rank back at once, and one process holding
// sessions cannot lock the other trainers of its uid out.
//
// The pending Attach calls are raw gRPC calls from this process, each on a
// session socket of its own (the client library waits for its answer; here
// thousands must be in flight at once).
#include <dirent.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
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

using ::testing::HasSubstr;

// Threads of process `pid` (its /proc/PID/task entries); -1 if unreadable.
int ThreadCount(pid_t pid) {
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/task").c_str());
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

// User + system CPU seconds process `pid` has used.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  // Fields after the name: state is 3; utime 14 and stime 15.
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i >= 14) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// A session socket and the id the daemon greeted it with, or the refusal.
struct Session {
  UniqueFd fd;
  uint64_t id = 0;
  std::string refusal;  // non-empty: refused with this reason
};

class PendingAttachTest : public GraddTest {
 protected:
  // The daemon's config for this test; "" for the defaults.
  virtual std::string Config() const = 0;

  void SetUp() override {
    // Thousands of session sockets in this process too.
    rlimit lim{};
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
      lim.rlim_cur = lim.rlim_max;
      setrlimit(RLIMIT_NOFILE, &lim);
    }
    char tmpl[] = "/tmp/gradd-pendcfg-XXXXXX";
    const int fd = mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    close(fd);
    config_ = tmpl;
    std::ofstream(config_) << Config();
    daemon_flags_ = {"--config", config_};
    GraddTest::SetUp();
    channel_ = grpc::CreateChannel("unix:" + socket_,
                                   grpc::InsecureChannelCredentials());
    node_ = v1::Node::NewStub(channel_);
    admin_ = v1::Admin::NewStub(channel_);
  }
  void TearDown() override {
    GraddTest::TearDown();
    unlink(config_.c_str());
  }

  // Connects a session as a trainer does.
  Session OpenSession() {
    Session s;
    absl::StatusOr<UniqueFd> fd = UnixSocket(SOCK_SEQPACKET);
    if (!fd.ok()) {
      ADD_FAILURE() << fd.status();
      return s;
    }
    std::optional<sockaddr_un> addr = UnixAddress(SessionSocketPath(socket_));
    if (!addr.has_value() || ConnectUnix(fd->get(), *addr) != 0) {
      ADD_FAILURE() << "cannot connect to " << SessionSocketPath(socket_)
                    << ": " << std::strerror(errno);
      return s;
    }
    absl::StatusOr<ReceivedMessage> msg = ReceiveWithFds(
        fd->get(), sizeof(SessionRefused), 0, std::chrono::milliseconds(5000));
    if (!msg.ok() || msg->payload.size() < sizeof(SessionHello)) {
      ADD_FAILURE() << "no session greeting";
      return s;
    }
    SessionHello hello;
    std::memcpy(&hello, msg->payload.data(), sizeof(hello));
    if (hello.kind == static_cast<uint32_t>(SessionMessageKind::kRefused) &&
        msg->payload.size() >= sizeof(SessionRefused)) {
      SessionRefused refused;
      std::memcpy(&refused, msg->payload.data(), sizeof(refused));
      s.refusal = refused.reason;
      if (s.refusal.empty()) s.refusal = "(refused without a reason)";
      return s;
    }
    s.fd = *std::move(fd);
    s.id = hello.session_id;
    return s;
  }

  static v1::AttachRequest AttachOf(const std::string& job, int rank, int world,
                                    uint64_t session) {
    v1::AttachRequest request;
    request.set_job_id(job);
    request.set_local_rank(rank);
    request.set_local_world_size(world);
    request.set_session_id(session);
    v1::ParamSpec* p = request.add_params();
    p->set_name("w");
    p->add_shape(4);
    p->set_dtype(v1::FLOAT32);
    return request;
  }

  // Attach in flight (the client's callback API: no thread here either).
  struct Call {
    grpc::ClientContext context;
    v1::AttachRequest request;
    v1::AttachResponse response;
    std::mutex mu;
    std::condition_variable cv;
    std::optional<grpc::Status> status;

    // Waits for the answer at most `timeout`; nullopt if none came.
    std::optional<grpc::Status> Wait(std::chrono::milliseconds timeout) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, timeout, [&] { return status.has_value(); });
      return status;
    }
  };

  std::unique_ptr<Call> StartAttach(v1::AttachRequest request,
                                    std::chrono::milliseconds deadline) {
    auto call = std::make_unique<Call>();
    call->request = std::move(request);
    call->context.set_deadline(std::chrono::system_clock::now() + deadline);
    Call* c = call.get();
    node_->async()->Attach(&c->context, &c->request, &c->response,
                           [c](grpc::Status s) {
                             std::lock_guard<std::mutex> lock(c->mu);
                             c->status = std::move(s);
                             c->cv.notify_all();
                           });
    return call;
  }

  grpc::Status AttachNow(const v1::AttachRequest& request) {
    v1::AttachResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(20));
    return node_->Attach(&context, request, &response);
  }

  // Local ranks waiting in pending jobs, as the admin API reports them; -1
  // if it does not answer.
  int PendingRanks() {
    v1::ListJobsResponse jobs;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    if (!admin_->ListJobs(&context, v1::ListJobsRequest(), &jobs).ok()) {
      return -1;
    }
    int n = 0;
    for (const v1::JobSummary& job : jobs.jobs()) {
      if (job.state() == v1::JOB_STATE_PENDING) {
        n += static_cast<int>(job.live_local_ranks());
      }
    }
    return n;
  }

  // Polls PendingRanks() until it is `want`; false after `timeout`.
  bool WaitForPendingRanks(int want, std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    int last = -1;
    while (std::chrono::steady_clock::now() < end) {
      last = PendingRanks();
      if (last == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "pending local ranks: " << last << ", expected " << want;
    return false;
  }

  std::string config_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Node::Stub> node_;
  std::unique_ptr<v1::Admin::Stub> admin_;
};

// Caps raised so that thousands of sessions fit.
class ManyPendingAttachesTest : public PendingAttachTest {
 protected:
  std::string Config() const override {
    return "max_sessions: 5000\nmax_sessions_per_uid: 5000\n"
           "max_sessions_per_process: 5000\n";
  }
};

// The attack of the issue: 4,000 Attach calls that never complete (jobs of
// local world size 256 of which only 250 ranks ever attach). Before the fix
// the daemon held one gRPC thread per call (4,013 threads) polling every
// 100 ms (140% CPU).
TEST_F(ManyPendingAttachesTest, FourThousandPendingAttachesHoldNoThreads) {
  constexpr int kJobs = 16;
  constexpr int kRanksPerJob = 250;
  constexpr int kWorld = 256;
  const int threads_idle = ThreadCount(daemon_.pid);
  ASSERT_GT(threads_idle, 0);

  std::vector<Session> sessions;
  std::vector<std::unique_ptr<Call>> calls;
  sessions.reserve(kJobs * kRanksPerJob);
  for (int j = 0; j < kJobs; ++j) {
    for (int r = 0; r < kRanksPerJob; ++r) {
      Session s = OpenSession();
      ASSERT_NE(s.id, 0u) << "session " << sessions.size() << ": " << s.refusal;
      calls.push_back(
          StartAttach(AttachOf(absl::StrCat("pending-", j), r, kWorld, s.id),
                      std::chrono::minutes(5)));
      sessions.push_back(std::move(s));
    }
  }
  ASSERT_TRUE(WaitForPendingRanks(kJobs * kRanksPerJob,
                                  std::chrono::milliseconds(60000)));

  const int threads_pending = ThreadCount(daemon_.pid);
  const double cpu_before = CpuSeconds(daemon_.pid);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double cpu_used = CpuSeconds(daemon_.pid) - cpu_before;
  std::cerr << "gradd threads: " << threads_idle << " idle, " << threads_pending
            << " with " << calls.size() << " pending attaches; CPU " << cpu_used
            << " s in 2 s\n";
  EXPECT_LT(threads_pending, 64)
      << "threads with " << calls.size() << " pending attaches";
  EXPECT_LT(threads_pending, threads_idle + 32);
  EXPECT_LT(cpu_used, 0.4) << "CPU seconds in 2 s with pending attaches";

  // None of them was answered meanwhile.
  for (auto& call : calls) {
    std::lock_guard<std::mutex> lock(call->mu);
    ASSERT_FALSE(call->status.has_value())
        << call->request.job_id() << " rank " << call->request.local_rank()
        << ": " << call->status->error_message();
  }

  // The clients give up: every pending rank is dropped at once (not at the
  // attach timeout), and the daemon still forms jobs.
  for (auto& call : calls) call->context.TryCancel();
  for (auto& call : calls) {
    std::optional<grpc::Status> s = call->Wait(std::chrono::seconds(30));
    ASSERT_TRUE(s.has_value()) << "a cancelled Attach was not answered";
    EXPECT_EQ(s->error_code(), grpc::StatusCode::CANCELLED)
        << s->error_message();
  }
  EXPECT_TRUE(WaitForPendingRanks(0, std::chrono::milliseconds(20000)));
  calls.clear();
  sessions.clear();
  ExpectHealthyJob("after-pending");
  EXPECT_LT(ThreadCount(daemon_.pid), 64);
}

// Default caps: one process cannot hold all of its uid's sessions.
class SessionCapTest : public PendingAttachTest {
 protected:
  std::string Config() const override {
    return "max_sessions_per_uid: 12\nmax_sessions_per_process: 4\n"
           "session_idle_timeout_ms: 60000\n";
  }
};

// A process that hogs sessions (idle or waiting in Attach) is refused past
// max_sessions_per_process with a reason, and another process of the same
// uid still runs its job at once, not after the idle timeout.
TEST_F(SessionCapTest, OneProcessCannotLockOutItsUid) {
  std::vector<Session> held;
  std::vector<std::unique_ptr<Call>> calls;
  std::string refusal;
  for (int i = 0; i < 12; ++i) {
    Session s = OpenSession();
    if (s.id == 0) {
      refusal = s.refusal;
      break;
    }
    if (i % 2 == 0) {
      calls.push_back(StartAttach(AttachOf("hog", i / 2, 8, s.id),
                                  std::chrono::minutes(2)));
    }
    held.push_back(std::move(s));
  }
  EXPECT_EQ(held.size(), 4u);
  EXPECT_THAT(refusal, HasSubstr("max_sessions_per_process"));
  EXPECT_THAT(refusal, HasSubstr(absl::StrCat("pid ", getpid())));

  // Two trainer processes of this uid: a 2-rank job forms and runs.
  ExpectHealthyJob("not-locked-out");
  for (auto& call : calls) call->context.TryCancel();
  for (auto& call : calls) call->Wait(std::chrono::seconds(10));
}

// Sessions parked by processes of a uid at its cap: another process's
// connection closes the oldest idle one (idle for at least 1 s) instead of
// being refused until session_idle_timeout_ms.
class IdleReapTest : public PendingAttachTest {
 protected:
  std::string Config() const override {
    return "max_sessions_per_uid: 4\nmax_sessions_per_process: 8\n"
           "session_idle_timeout_ms: 60000\n";
  }
};

TEST_F(IdleReapTest, IdleSessionsOfAnotherProcessMakeRoom) {
  std::vector<Session> parked;
  for (int i = 0; i < 4; ++i) {
    parked.push_back(OpenSession());
    ASSERT_NE(parked.back().id, 0u) << parked.back().refusal;
  }
  // This process is at the uid's cap; its own sessions are not reaped for
  // it.
  Session own = OpenSession();
  EXPECT_EQ(own.id, 0u);
  EXPECT_THAT(own.refusal, HasSubstr("max_sessions_per_uid"));

  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  // Two trainer processes of this uid: each takes the place of one parked
  // session, at once.
  const auto start = std::chrono::steady_clock::now();
  ExpectHealthyJob("reaped-room");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  int closed = 0;
  for (Session& s : parked) {
    char buf[sizeof(SessionRefused)];
    const ssize_t n = recv(s.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(sizeof(SessionRefused))) {
      SessionRefused refused;
      std::memcpy(&refused, buf, sizeof(refused));
      EXPECT_THAT(std::string(refused.reason),
                  HasSubstr("another process of uid"));
      ++closed;
    }
  }
  EXPECT_EQ(closed, 2);
}

class CancelledAttachTest : public PendingAttachTest {
 protected:
  std::string Config() const override {
    return "session_idle_timeout_ms: 1500\n";
  }
};

// An Attach whose client gives up frees its rank at once: before the fix
// the rank stayed taken (and the job pending with its world size) until
// attach_timeout_ms (60 s). Its session is idle again: the trainer may
// retry on it, or it is closed after session_idle_timeout_ms.
TEST_F(CancelledAttachTest, CancelledAttachFreesItsRankAndSession) {
  Session a = OpenSession();
  ASSERT_NE(a.id, 0u) << a.refusal;
  std::unique_ptr<Call> cancelled =
      StartAttach(AttachOf("cxl", 1, 3, a.id), std::chrono::seconds(60));
  ASSERT_TRUE(WaitForPendingRanks(1, std::chrono::milliseconds(5000)));
  cancelled->context.TryCancel();
  std::optional<grpc::Status> s = cancelled->Wait(std::chrono::seconds(10));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitForPendingRanks(0, std::chrono::milliseconds(5000)));

  // The job is gone: the same rank on the same session attaches afresh,
  // now in a job of world size 2, and forms it with a new rank 0.
  std::unique_ptr<Call> again =
      StartAttach(AttachOf("cxl", 1, 2, a.id), std::chrono::seconds(20));
  Session b = OpenSession();
  ASSERT_NE(b.id, 0u) << b.refusal;
  grpc::Status rank0 = AttachNow(AttachOf("cxl", 0, 2, b.id));
  EXPECT_TRUE(rank0.ok()) << rank0.error_message();
  s = again->Wait(std::chrono::seconds(20));
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->ok()) << s->error_message();

  // A cancelled session not used again is closed as idle.
  Session c = OpenSession();
  ASSERT_NE(c.id, 0u) << c.refusal;
  std::unique_ptr<Call> idle =
      StartAttach(AttachOf("idle", 0, 2, c.id), std::chrono::seconds(60));
  ASSERT_TRUE(WaitForPendingRanks(1, std::chrono::milliseconds(5000)));
  // Claimed while pending: not closed as idle meanwhile.
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  {
    std::lock_guard<std::mutex> lock(idle->mu);
    EXPECT_FALSE(idle->status.has_value());
  }
  idle->context.TryCancel();
  ASSERT_TRUE(idle->Wait(std::chrono::seconds(10)).has_value());
  absl::StatusOr<ReceivedMessage> closed = ReceiveWithFds(
      c.fd.get(), sizeof(SessionRefused), 0, std::chrono::milliseconds(6000));
  ASSERT_TRUE(closed.ok()) << closed.status();
  ASSERT_EQ(closed->payload.size(), sizeof(SessionRefused));
  SessionRefused refused;
  std::memcpy(&refused, closed->payload.data(), sizeof(refused));
  EXPECT_THAT(std::string(refused.reason),
              HasSubstr("session_idle_timeout_ms"));
}

}  // namespace
}  // namespace gradd::testing
