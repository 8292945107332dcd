// The Daemon with its real sockets: session socket greeting and fd passing,
// gRPC Attach over unix:, liveness through the socket closing, shutdown.
#include "server/daemon.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/control_block.h"
#include "common/control_mapping.h"
#include "common/doorbell.h"
#include "common/session.h"
#include "common/shm.h"
#include "gmock/gmock.h"
#include "gradd/v1/node.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/config.h"
#include "tests/support/temp_dir.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = ::gradd::testing::MakeTempDir("gradd-daemon-test-");
    ASSERT_FALSE(root_.empty());
    config_ = DefaultConfig();
    config_.set_socket_path(root_ + "/run/gradd.sock");
  }
  void TearDown() override {
    daemon_.reset();
    std::string cmd = "rm -rf " + root_;
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }

  UniqueFd ConnectSession() {
    UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = SessionSocketPath(config_.socket_path());
    std::memcpy(addr.sun_path, path.data(), path.size());
    EXPECT_EQ(
        connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
        << std::strerror(errno);
    return fd;
  }

  uint64_t ReadHello(int fd) {
    absl::StatusOr<ReceivedMessage> msg =
        ReceiveWithFds(fd, 64, 0, std::chrono::milliseconds(5000));
    EXPECT_TRUE(msg.ok()) << msg.status();
    if (!msg.ok()) return 0;
    SessionHello hello;
    EXPECT_EQ(msg->payload.size(), sizeof(hello));
    std::memcpy(&hello, msg->payload.data(), sizeof(hello));
    EXPECT_EQ(hello.magic, kSessionMagic);
    EXPECT_EQ(hello.kind, static_cast<uint32_t>(SessionMessageKind::kHello));
    return hello.session_id;
  }

  std::unique_ptr<v1::Node::Stub> Stub() {
    return v1::Node::NewStub(grpc::CreateChannel(
        "unix:" + config_.socket_path(), grpc::InsecureChannelCredentials()));
  }

  // Waits (bounded) for the manager to reach `n` jobs.
  bool WaitForJobs(int n) {
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      if (daemon_->job_manager().NumJobs() == n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }

  std::string root_;
  v1::DaemonConfig config_;
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(DaemonTest, AttachIterateDisconnectAndShutDown) {
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Create(config_);
  ASSERT_TRUE(d.ok()) << d.status();
  daemon_ = *std::move(d);

  struct stat st {};
  ASSERT_EQ(stat((root_ + "/run").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat(config_.socket_path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0077, 0u);

  // Two ranks, each with a session.
  UniqueFd s0 = ConnectSession();
  UniqueFd s1 = ConnectSession();
  const uint64_t id0 = ReadHello(s0.get());
  const uint64_t id1 = ReadHello(s1.get());
  ASSERT_NE(id0, id1);

  auto attach = [&](int rank, uint64_t session, v1::AttachResponse* resp) {
    v1::AttachRequest req;
    req.set_job_id("daemon-test");
    req.set_local_rank(rank);
    req.set_local_world_size(2);
    req.set_session_id(session);
    v1::ParamSpec* p = req.add_params();
    p->set_name("w");
    p->add_shape(1000);
    p->set_dtype(v1::FLOAT32);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(20));
    return Stub()->Attach(&ctx, req, resp);
  };
  v1::AttachResponse r0, r1;
  grpc::Status st1;
  std::thread t([&] { st1 = attach(1, id1, &r1); });
  grpc::Status st0 = attach(0, id0, &r0);
  t.join();
  ASSERT_TRUE(st0.ok()) << st0.error_message();
  ASSERT_TRUE(st1.ok()) << st1.error_message();

  // The fds arrived on the session sockets, tagged with the attach id.
  ControlLayout layout(2, r0.bucket_slots());
  std::vector<ControlMapping> ctl;
  std::vector<Mapping> mem;
  std::vector<UniqueFd> bells;
  int r = 0;
  for (auto [fd, resp] : {std::pair{s0.get(), &r0}, std::pair{s1.get(), &r1}}) {
    absl::StatusOr<ReceivedMessage> msg =
        ReceiveWithFds(fd, 64, 4, std::chrono::milliseconds(5000));
    ASSERT_TRUE(msg.ok()) << msg.status();
    SessionFds fds;
    ASSERT_EQ(msg->payload.size(), sizeof(fds));
    std::memcpy(&fds, msg->payload.data(), sizeof(fds));
    EXPECT_EQ(fds.attach_id, resp->attach_id());
    // Job block, rank memory, rank block, bell.
    ASSERT_EQ(msg->fds.size(), 4u);
    EXPECT_EQ(resp->control_block_bytes(), layout.job_bytes());
    EXPECT_TRUE(
        CheckSealedMemfd(msg->fds[0].get(), resp->control_block_bytes()).ok());
    EXPECT_TRUE(
        CheckSealedMemfd(msg->fds[1].get(), resp->rank_memory_bytes()).ok());
    EXPECT_TRUE(
        CheckSealedMemfd(msg->fds[2].get(), layout.rank_block_bytes()).ok());
    absl::StatusOr<ControlMapping> m = ControlMapping::MapRank(
        layout, msg->fds[0].get(), r, msg->fds[2].get());
    ASSERT_TRUE(m.ok()) << m.status();
    ctl.push_back(*std::move(m));
    mem.push_back(*Mapping::Map(msg->fds[1].get(), resp->rank_memory_bytes()));
    bells.push_back(std::move(msg->fds[3]));
    ++r;
  }

  // One iteration through the real daemon.
  for (int r = 0; r < 2; ++r) {
    float* g = reinterpret_cast<float*>(static_cast<char*>(mem[r].data()) +
                                        r0.buckets(0).offset());
    for (int i = 0; i < 1000; ++i) g[i] = r == 0 ? i : 3 * i;
    layout.ready_row(ctl[r].data(), r)[0].store(1, std::memory_order_release);
    RingDaemon(layout.header(ctl[r].data()),
               layout.rank_header(ctl[r].data(), r), bells[r].get());
  }
  ControlHeader* h0 = layout.header(ctl[0].data());
  RankHeader* me0 = layout.rank_header(ctl[0].data(), 0);
  ASSERT_TRUE(WaitForDaemon(
      h0, me0,
      [&] {
        return layout.done_seq(ctl[0].data())[0].load(
                   std::memory_order_acquire) == 1;
      },
      std::chrono::microseconds(10), std::chrono::seconds(10)));
  const float* out = reinterpret_cast<const float*>(
      static_cast<char*>(mem[1].data()) + r1.buckets(0).offset());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(out[i], 2.0f * i) << i;

  // Rank 1 dies while rank 0 waits in iteration 2.
  layout.ready_row(ctl[0].data(), 0)[0].store(2, std::memory_order_release);
  RingDaemon(h0, me0, bells[0].get());
  s1.reset();
  EXPECT_FALSE(WaitForDaemon(
      h0, me0, [] { return false; }, std::chrono::microseconds(10),
      std::chrono::seconds(10)));
  absl::Status err = ReadError(h0);
  EXPECT_EQ(err.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(err.message()),
              HasSubstr("local rank 1 of job 'daemon-test' disconnected "
                        "during iteration 2"));
  s0.reset();
  EXPECT_TRUE(WaitForJobs(0));

  // A second job, then shutdown: its rank learns why.
  UniqueFd s2 = ConnectSession();
  const uint64_t id2 = ReadHello(s2.get());
  v1::AttachRequest req;
  req.set_job_id("solo");
  req.set_local_world_size(1);
  req.set_session_id(id2);
  v1::ParamSpec* p = req.add_params();
  p->set_name("x");
  p->add_shape(4);
  p->set_dtype(v1::FLOAT64);
  v1::AttachResponse r2;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  ASSERT_TRUE(Stub()->Attach(&ctx, req, &r2).ok());
  absl::StatusOr<ReceivedMessage> msg =
      ReceiveWithFds(s2.get(), 64, 4, std::chrono::milliseconds(5000));
  ASSERT_TRUE(msg.ok());
  // The job block only maps read-only.
  void* solo = mmap(nullptr, r2.control_block_bytes(), PROT_READ, MAP_SHARED,
                    msg->fds[0].get(), 0);
  ASSERT_NE(solo, MAP_FAILED);

  daemon_->Shutdown();
  absl::Status down = ReadError(static_cast<ControlHeader*>(solo));
  munmap(solo, r2.control_block_bytes());
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(down.message()),
              HasSubstr("gradd daemon shutting down"));
  EXPECT_NE(access(config_.socket_path().c_str(), F_OK), 0);
  EXPECT_NE(access(SessionSocketPath(config_.socket_path()).c_str(), F_OK), 0);
  // The session socket was closed by the daemon.
  EXPECT_EQ(ReceiveWithFds(s2.get(), 64, 4, std::chrono::milliseconds(5000))
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
}

// The trainer may call Attach the instant it reads the hello: the session
// must already be known then (regression: it was registered after the
// greeting was sent, and a fast Attach was refused as "not connected").
TEST_F(DaemonTest, AttachRightAfterHelloFindsTheSession) {
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Create(config_);
  ASSERT_TRUE(d.ok()) << d.status();
  daemon_ = *std::move(d);
  std::unique_ptr<v1::Node::Stub> stub = Stub();
  for (int i = 0; i < 200; ++i) {
    UniqueFd session = ConnectSession();
    const uint64_t id = ReadHello(session.get());
    v1::AttachRequest req;
    req.set_job_id("fast-" + std::to_string(i));
    req.set_local_rank(0);
    req.set_local_world_size(1);
    req.set_session_id(id);
    v1::ParamSpec* p = req.add_params();
    p->set_name("w");
    p->add_shape(16);
    p->set_dtype(v1::FLOAT32);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(20));
    v1::AttachResponse resp;
    grpc::Status st = stub->Attach(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << "attach " << i << ": " << st.error_message();
  }
}

TEST_F(DaemonTest, AttachWithUnknownSessionIsRefused) {
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Create(config_);
  ASSERT_TRUE(d.ok()) << d.status();
  daemon_ = *std::move(d);
  v1::AttachRequest req;
  req.set_job_id("j");
  req.set_local_world_size(1);
  req.set_session_id(12345);
  v1::ParamSpec* p = req.add_params();
  p->set_name("x");
  p->add_shape(4);
  p->set_dtype(v1::FLOAT32);
  v1::AttachResponse resp;
  grpc::ClientContext ctx;
  grpc::Status st = Stub()->Attach(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("session 12345 is not connected"));
}

TEST_F(DaemonTest, SecondDaemonOnTheSameSocketIsRefused) {
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Create(config_);
  ASSERT_TRUE(d.ok()) << d.status();
  daemon_ = *std::move(d);
  absl::StatusOr<std::unique_ptr<Daemon>> second = Daemon::Create(config_);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("already listening on " + config_.socket_path()));
}

TEST_F(DaemonTest, StaleSocketIsReplaced) {
  // A socket file nobody listens on, as a crashed daemon leaves behind.
  ASSERT_TRUE(PrepareSocketDirectory(config_.socket_path()).ok());
  {
    UniqueFd fd(socket(AF_UNIX, SOCK_STREAM, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, config_.socket_path().data(),
                config_.socket_path().size());
    ASSERT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
              0);
  }
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Create(config_);
  ASSERT_TRUE(d.ok()) << d.status();
}

TEST_F(DaemonTest, OpenDirectoryIsRefused) {
  const std::string dir = root_ + "/open";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  config_.set_socket_path(dir + "/gradd.sock");
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Create(config_);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()),
              HasSubstr("writable by other users"));
  // Sticky (like /tmp) is fine.
  ASSERT_EQ(chmod(dir.c_str(), 01777), 0);
  EXPECT_TRUE(PrepareSocketDirectory(config_.socket_path()).ok());
}

TEST_F(DaemonTest, NonSocketFileIsNotRemoved) {
  ASSERT_TRUE(PrepareSocketDirectory(config_.socket_path()).ok());
  {
    std::FILE* f = std::fopen(config_.socket_path().c_str(), "w");
    std::fclose(f);
  }
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Create(config_);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("is not a socket"));
  EXPECT_EQ(access(config_.socket_path().c_str(), F_OK), 0);
}

}  // namespace
}  // namespace gradd
