#include "common/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

struct SocketPair {
  UniqueFd a, b;
};

SocketPair MakePair(int type = SOCK_SEQPACKET) {
  int fds[2];
  EXPECT_EQ(socketpair(AF_UNIX, type | SOCK_CLOEXEC, 0, fds), 0);
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

TEST(UniqueFdTest, ClosesAndMoves) {
  int raw[2];
  ASSERT_EQ(pipe(raw), 0);
  {
    UniqueFd r(raw[0]);
    UniqueFd moved = std::move(r);
    EXPECT_FALSE(r.valid());
    EXPECT_EQ(moved.get(), raw[0]);
    UniqueFd w(raw[1]);
    w = std::move(moved);  // closes the write end, takes the read end
    EXPECT_EQ(w.get(), raw[0]);
    EXPECT_EQ(fcntl(raw[1], F_GETFD), -1);
  }
  EXPECT_EQ(fcntl(raw[0], F_GETFD), -1) << "destructor closes";
  UniqueFd f(dup(1));
  int released = f.release();
  EXPECT_FALSE(f.valid());
  EXPECT_NE(fcntl(released, F_GETFD), -1);
  close(released);
}

TEST(MemfdTest, SealedAgainstResizeAndCloexec) {
  auto fd = CreateSealedMemfd("gradd-test", 8192);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(ftruncate(fd->get(), 4096), -1) << "shrink must fail";
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(ftruncate(fd->get(), 16384), -1) << "grow must fail";
  EXPECT_EQ(fcntl(fd->get(), F_ADD_SEALS, F_SEAL_WRITE), -1)
      << "further seals must fail";
  EXPECT_TRUE(fcntl(fd->get(), F_GETFD) & FD_CLOEXEC);
  int seals = fcntl(fd->get(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_TRUE(CheckSealedMemfd(fd->get(), 8192).ok());
  EXPECT_EQ(CheckSealedMemfd(fd->get(), 8193).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MemfdTest, CheckRejectsUnsealedAndNonMemfd) {
  int unsealed = memfd_create("plain", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(unsealed, 0);
  UniqueFd owner(unsealed);
  ASSERT_EQ(ftruncate(unsealed, 4096), 0);
  auto s = CheckSealedMemfd(unsealed, 4096);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("shrink"));

  int raw[2];
  ASSERT_EQ(pipe(raw), 0);
  UniqueFd r(raw[0]), w(raw[1]);
  EXPECT_EQ(CheckSealedMemfd(raw[0], 1).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MappingTest, TwoMappingsShareMemoryAndZeroFilled) {
  auto fd = CreateSealedMemfd("gradd-map", 3 * 4096);
  ASSERT_TRUE(fd.ok());
  auto m1 = Mapping::Map(fd->get(), 3 * 4096);
  auto m2 = Mapping::Map(fd->get(), 3 * 4096);
  ASSERT_TRUE(m1.ok() && m2.ok());
  ASSERT_NE(m1->data(), m2->data());
  auto* p1 = static_cast<uint32_t*>(m1->data());
  auto* p2 = static_cast<uint32_t*>(m2->data());
  for (size_t i = 0; i < 3 * 1024; ++i) ASSERT_EQ(p1[i], 0u);
  p1[5000 / 4] = 0xDEADBEEF;
  EXPECT_EQ(p2[5000 / 4], 0xDEADBEEFu);

  Mapping moved = std::move(*m1);
  EXPECT_EQ(m1->data(), nullptr);
  EXPECT_EQ(static_cast<uint32_t*>(moved.data())[5000 / 4], 0xDEADBEEFu);

  EXPECT_FALSE(Mapping::Map(-1, 4096).ok());
  EXPECT_FALSE(Mapping::Map(fd->get(), 0).ok());
}

TEST(FdPassingTest, SendsPayloadAndFdsOverSeqpacket) {
  SocketPair sp = MakePair();
  auto mem = CreateSealedMemfd("gradd-pass", 4096);
  ASSERT_TRUE(mem.ok());
  auto map = Mapping::Map(mem->get(), 4096);
  ASSERT_TRUE(map.ok());
  std::strcpy(static_cast<char*>(map->data()), "hello from the sender");

  int raw[2];
  ASSERT_EQ(pipe(raw), 0);
  UniqueFd r(raw[0]), w(raw[1]);
  ASSERT_TRUE(
      SendWithFds(sp.a.get(), "header-bytes", {mem->get(), raw[1]}).ok());

  auto msg = ReceiveWithFds(sp.b.get(), 64, 4, std::chrono::seconds(5));
  ASSERT_TRUE(msg.ok()) << msg.status();
  EXPECT_EQ(msg->payload, "header-bytes");
  ASSERT_EQ(msg->fds.size(), 2u);
  // Received fds are new descriptors, close-on-exec.
  EXPECT_NE(msg->fds[0].get(), mem->get());
  EXPECT_TRUE(fcntl(msg->fds[0].get(), F_GETFD) & FD_CLOEXEC);
  EXPECT_TRUE(CheckSealedMemfd(msg->fds[0].get(), 4096).ok());
  auto map2 = Mapping::Map(msg->fds[0].get(), 4096);
  ASSERT_TRUE(map2.ok());
  EXPECT_STREQ(static_cast<char*>(map2->data()), "hello from the sender");
  // The pipe's write end works through the received copy.
  ASSERT_EQ(write(msg->fds[1].get(), "x", 1), 1);
  char c;
  ASSERT_EQ(read(raw[0], &c, 1), 1);
  EXPECT_EQ(c, 'x');
}

TEST(FdPassingTest, StreamSocketAndEmptyPayload) {
  SocketPair sp = MakePair(SOCK_STREAM);
  auto mem = CreateSealedMemfd("gradd-stream", 4096);
  ASSERT_TRUE(mem.ok());
  ASSERT_TRUE(SendWithFds(sp.a.get(), "", {mem->get()}).ok());
  auto msg = ReceiveWithFds(sp.b.get(), 0, 1, std::chrono::seconds(5));
  ASSERT_TRUE(msg.ok()) << msg.status();
  EXPECT_EQ(msg->payload, "");
  ASSERT_EQ(msg->fds.size(), 1u);
  EXPECT_TRUE(CheckSealedMemfd(msg->fds[0].get(), 4096).ok());
}

TEST(FdPassingTest, ForkedChildReceivesMemfdAndWritesIntoIt) {
  SocketPair sp = MakePair();
  auto mem = CreateSealedMemfd("gradd-child", 4096);
  ASSERT_TRUE(mem.ok());
  auto map = Mapping::Map(mem->get(), 4096);
  ASSERT_TRUE(map.ok());

  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: no gtest assertions (they would report in the wrong process);
    // the exit code says what failed.
    sp.a.reset();
    auto msg = ReceiveWithFds(sp.b.get(), 64, 2, std::chrono::seconds(10));
    if (!msg.ok() || msg->fds.size() != 1 || msg->payload != "map me") {
      _exit(2);
    }
    if (!CheckSealedMemfd(msg->fds[0].get(), 4096).ok()) _exit(3);
    auto m = Mapping::Map(msg->fds[0].get(), 4096);
    if (!m.ok()) _exit(4);
    auto* words = static_cast<uint64_t*>(m->data());
    for (int i = 0; i < 512; ++i) words[i] = 1000 + i;
    if (!SendWithFds(sp.b.get(), "done", {}).ok()) _exit(5);
    _exit(0);
  }
  sp.b.reset();
  ASSERT_TRUE(SendWithFds(sp.a.get(), "map me", {mem->get()}).ok());
  auto reply = ReceiveWithFds(sp.a.get(), 16, 0, std::chrono::seconds(10));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, "done");
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  auto* words = static_cast<uint64_t*>(map->data());
  for (int i = 0; i < 512; ++i) ASSERT_EQ(words[i], 1000u + i) << i;
}

TEST(FdPassingTest, TimeoutIsDeadlineExceeded) {
  SocketPair sp = MakePair();
  auto start = std::chrono::steady_clock::now();
  auto msg = ReceiveWithFds(sp.b.get(), 64, 1, std::chrono::milliseconds(50));
  auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(msg.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(waited, std::chrono::milliseconds(45));
  EXPECT_LT(waited, std::chrono::seconds(5));
}

TEST(FdPassingTest, ClosedPeerIsUnavailable) {
  SocketPair sp = MakePair();
  sp.a.reset();
  auto msg = ReceiveWithFds(sp.b.get(), 64, 1, std::chrono::seconds(5));
  EXPECT_EQ(msg.status().code(), absl::StatusCode::kUnavailable);

  // Sending to a closed peer is an error too, not a SIGPIPE.
  SocketPair sp2 = MakePair();
  sp2.b.reset();
  auto sent = SendWithFds(sp2.a.get(), "x", {});
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
}

TEST(FdPassingTest, PeerClosingWhileWaitingWakesReceiver) {
  SocketPair sp = MakePair();
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    sp.a.reset();
  });
  auto msg = ReceiveWithFds(sp.b.get(), 64, 1, std::chrono::seconds(10));
  closer.join();
  EXPECT_EQ(msg.status().code(), absl::StatusCode::kUnavailable);
}

TEST(FdPassingTest, OversizedMessagesAreRejectedWithoutLeaks) {
  SocketPair sp = MakePair();
  auto m1 = CreateSealedMemfd("a", 4096);
  auto m2 = CreateSealedMemfd("b", 4096);
  ASSERT_TRUE(m1.ok() && m2.ok());
  ASSERT_TRUE(SendWithFds(sp.a.get(), "0123456789", {}).ok());
  auto big = ReceiveWithFds(sp.b.get(), 4, 0, std::chrono::seconds(5));
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(SendWithFds(sp.a.get(), "x", {m1->get(), m2->get()}).ok());
  auto many = ReceiveWithFds(sp.b.get(), 4, 1, std::chrono::seconds(5));
  EXPECT_EQ(many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(many.status().message(), HasSubstr("file descriptors"));
}

}  // namespace
}  // namespace gradd
