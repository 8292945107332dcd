// gradd under a stand-in for systemd: the test binds the datagram socket
// named by $NOTIFY_SOCKET (Type=notify) and a real daemon reports READY=1
// once its sockets serve, WATCHDOG=1 at half of $WATCHDOG_USEC from its
// control loop, and STOPPING=1 on SIGTERM.
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "tests/support/temp_dir.h"

namespace gradd::testing {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// True if a stream connection to the Unix socket `path` is accepted.
bool Connects(const std::string& path, int type) {
  const int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok =
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

class SystemdTest : public GraddTest {
 protected:
  void SetUp() override {
    notify_dir_ = ::gradd::testing::MakeTempDir("gradd-sd-");
    ASSERT_FALSE(notify_dir_.empty());
    notify_path_ = notify_dir_ + "/notify";
    notify_fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(notify_fd_, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, notify_path_.c_str(),
                 sizeof(addr.sun_path) - 1);
    ASSERT_EQ(
        bind(notify_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
        << std::strerror(errno);
    // What systemd sets for a Type=notify service with WatchdogSec=200ms;
    // inherited by the daemon GraddTest::SetUp starts, and no one else.
    setenv("NOTIFY_SOCKET", notify_path_.c_str(), 1);
    setenv("WATCHDOG_USEC", "200000", 1);
    GraddTest::SetUp();
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
  }
  void TearDown() override {
    GraddTest::TearDown();
    if (notify_fd_ >= 0) close(notify_fd_);
    ::gradd::testing::RemoveTree(notify_dir_);
  }

  // The next notification, or "" if none comes within `timeout`.
  std::string Next(std::chrono::milliseconds timeout) {
    pollfd p{notify_fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) != 1) return "";
    char buf[4096];
    const ssize_t n = recv(notify_fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, n) : "";
  }

  std::string notify_dir_, notify_path_;
  int notify_fd_ = -1;
};

TEST_F(SystemdTest, ReadyWatchdogAndStopping) {
  // READY=1 comes first, and only once both sockets answer.
  const std::string ready = Next(milliseconds(10000));
  ASSERT_THAT(ready, HasSubstr("READY=1")) << ReadFile(daemon_.log);
  EXPECT_THAT(ready, HasSubstr("STATUS=serving on unix:" + socket_));
  EXPECT_TRUE(Connects(socket_, SOCK_STREAM));
  EXPECT_TRUE(Connects(socket_ + ".session", SOCK_SEQPACKET));

  // Pings every 100 ms (half of WATCHDOG_USEC) from the control loop; a job
  // running meanwhile does not hold them up.
  int pings = 0;
  const auto deadline = Clock::now() + milliseconds(10000);
  while (pings < 3 && Clock::now() < deadline) {
    const std::string m = Next(milliseconds(5000));
    if (m == "WATCHDOG=1")
      ++pings;
    else
      ADD_FAILURE() << "unexpected notification '" << m << "'";
    if (m.empty()) break;
  }
  EXPECT_EQ(pings, 3);
  ExpectHealthyJob("sd");
  EXPECT_TRUE(WaitForText(daemon_, "systemd watchdog: pinging every 100ms",
                          milliseconds(1000)));

  ASSERT_EQ(StopDaemon(), 0) << ReadFile(daemon_.log);
  // The daemon has exited: everything it sent is queued. STOPPING=1 is the
  // last word; only watchdog pings may come before it.
  std::vector<std::string> rest;
  for (std::string m = Next(milliseconds(0)); !m.empty();
       m = Next(milliseconds(0))) {
    rest.push_back(m);
  }
  ASSERT_FALSE(rest.empty());
  EXPECT_THAT(rest.back(), HasSubstr("STOPPING=1"));
  EXPECT_THAT(rest.back(), HasSubstr("STATUS=SIGTERM, shutting down"));
  for (size_t i = 0; i + 1 < rest.size(); ++i) EXPECT_EQ(rest[i], "WATCHDOG=1");
}

}  // namespace
}  // namespace gradd::testing
