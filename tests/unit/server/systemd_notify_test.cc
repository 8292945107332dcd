// SystemdNotifier against a datagram socket standing in for systemd's
// $NOTIFY_SOCKET.
#include "server/systemd_notify.h"

#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace gradd {
namespace {

class SystemdNotifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::gradd::testing::MakeTempDir("gradd-notify-");
    ASSERT_FALSE(dir_.empty());
    path_ = dir_ + "/notify";
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd_, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
        << std::strerror(errno);
    setenv("NOTIFY_SOCKET", path_.c_str(), 1);
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
  }
  void TearDown() override {
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    if (fd_ >= 0) close(fd_);
    ::gradd::testing::RemoveTree(dir_);
  }
  // The next datagram, or "" after 5 s.
  std::string Receive() {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 5000) != 1) return "";
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, n) : "";
  }

  std::string dir_, path_;
  int fd_ = -1;
};

TEST_F(SystemdNotifyTest, SendsReadyWatchdogAndStopping) {
  std::unique_ptr<SystemdNotifier> n = SystemdNotifier::FromEnvironment();
  EXPECT_TRUE(n->enabled());
  n->Ready("serving on unix:/x\nsecond line");
  EXPECT_EQ(Receive(), "READY=1\nSTATUS=serving on unix:/x second line");
  n->Watchdog();
  EXPECT_EQ(Receive(), "WATCHDOG=1");
  n->Stopping("SIGTERM");
  EXPECT_EQ(Receive(), "STOPPING=1\nSTATUS=SIGTERM");
}

TEST_F(SystemdNotifyTest, WatchdogIntervalIsHalfOfWatchdogUsec) {
  EXPECT_EQ(SystemdNotifier::FromEnvironment()->WatchdogInterval(),
            absl::InfiniteDuration());
  setenv("WATCHDOG_USEC", "3000000", 1);
  EXPECT_EQ(SystemdNotifier::FromEnvironment()->WatchdogInterval(),
            absl::Milliseconds(1500));
  // Meant for another process (e.g. our parent): not ours to ping.
  setenv("WATCHDOG_PID", absl::StrCat(getpid() + 1).c_str(), 1);
  EXPECT_EQ(SystemdNotifier::FromEnvironment()->WatchdogInterval(),
            absl::InfiniteDuration());
  setenv("WATCHDOG_PID", absl::StrCat(getpid()).c_str(), 1);
  EXPECT_EQ(SystemdNotifier::FromEnvironment()->WatchdogInterval(),
            absl::Milliseconds(1500));
}

TEST_F(SystemdNotifyTest, WithoutNotifySocketEverythingIsANoOp) {
  unsetenv("NOTIFY_SOCKET");
  setenv("WATCHDOG_USEC", "3000000", 1);
  std::unique_ptr<SystemdNotifier> n = SystemdNotifier::FromEnvironment();
  EXPECT_FALSE(n->enabled());
  EXPECT_EQ(n->WatchdogInterval(), absl::InfiniteDuration());
  n->Ready("x");
  n->Watchdog();
  n->Stopping("x");
  pollfd p{fd_, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0);  // nothing was sent
}

}  // namespace
}  // namespace gradd
