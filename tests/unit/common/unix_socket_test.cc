#include "common/unix_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

class UnixSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::gradd::testing::MakeTempDir("gradd-unix-socket-test-");
    ASSERT_FALSE(dir_.empty());
    path_ = dir_ + "/s.sock";
  }
  void TearDown() override { ::gradd::testing::RemoveTree(dir_); }
  std::string dir_;
  std::string path_;
};

TEST_F(UnixSocketTest, ListensWithTheModeAndTypeAsked) {
  absl::StatusOr<UniqueFd> listener =
      ListenUnix(path_, SOCK_SEQPACKET | SOCK_NONBLOCK, 0600, "test socket");
  ASSERT_TRUE(listener.ok()) << listener.status();
  struct stat st {};
  ASSERT_EQ(lstat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_NE(fcntl(listener->get(), F_GETFD) & FD_CLOEXEC, 0);
  EXPECT_NE(fcntl(listener->get(), F_GETFL) & O_NONBLOCK, 0);
  int type = 0;
  socklen_t len = sizeof(type);
  ASSERT_EQ(getsockopt(listener->get(), SOL_SOCKET, SO_TYPE, &type, &len), 0);
  EXPECT_EQ(type, SOCK_SEQPACKET);

  absl::StatusOr<UniqueFd> client = UnixSocket(SOCK_SEQPACKET);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(ConnectUnix(client->get(), *UnixAddress(path_)), 0);
}

TEST_F(UnixSocketTest, ConnectReportsTheErrno) {
  absl::StatusOr<UniqueFd> client = UnixSocket(SOCK_STREAM);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(ConnectUnix(client->get(), *UnixAddress(path_)), ENOENT);
}

TEST_F(UnixSocketTest, TakenPathIsUnavailableNamingIt) {
  absl::StatusOr<UniqueFd> first =
      ListenUnix(path_, SOCK_STREAM, 0600, "test socket");
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<UniqueFd> second =
      ListenUnix(path_, SOCK_STREAM, 0600, "test socket");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(),
              HasSubstr("cannot bind test socket " + path_));
}

TEST_F(UnixSocketTest, TooLongPathIsInvalidArgument) {
  const std::string path = dir_ + "/" + std::string(120, 'x');
  EXPECT_FALSE(UnixAddress(path).has_value());
  EXPECT_TRUE(UnixAddress(std::string(107, 'x')).has_value());
  absl::StatusOr<UniqueFd> listener =
      ListenUnix(path, SOCK_STREAM, 0600, "test socket");
  EXPECT_EQ(listener.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(listener.status().message(),
              HasSubstr("test socket path too long"));
}

}  // namespace
}  // namespace gradd
