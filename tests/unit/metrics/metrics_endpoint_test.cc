#include "server/metrics/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics/daemon_metrics.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

// GET `path` from 127.0.0.1:port; the whole response ("" on error).
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = absl::StrCat(
        "GET ", path,
        " HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
    }
  }
  close(fd);
  return out;
}

TEST(MetricsEndpointTest, ServesTheRegistryOnAnOsChosenPort) {
  DaemonMetrics metrics;
  metrics.OnAttach(absl::StatusCode::kOk);
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Create("127.0.0.1:0", metrics.registry());
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  ASSERT_GT((*endpoint)->port(), 0);
  const std::string response = HttpGet((*endpoint)->port(), "/metrics");
  EXPECT_THAT(response, HasSubstr("200 OK"));
  EXPECT_THAT(response, HasSubstr("gradd_attaches_total{code=\"OK\"} 1"));
}

TEST(MetricsEndpointTest, PortOnlyMeansEveryInterface) {
  DaemonMetrics metrics;
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Create(":0", metrics.registry());
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  EXPECT_THAT(HttpGet((*endpoint)->port(), "/metrics"),
              HasSubstr("gradd_jobs 0"));
}

TEST(MetricsEndpointTest, AnAddressInUseIsUnavailableNamingIt) {
  DaemonMetrics metrics;
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> first =
      MetricsEndpoint::Create("127.0.0.1:0", metrics.registry());
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = absl::StrCat("127.0.0.1:", (*first)->port());
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> second =
      MetricsEndpoint::Create(taken, metrics.registry());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("cannot serve /metrics on ", taken)));
}

}  // namespace
}  // namespace gradd
