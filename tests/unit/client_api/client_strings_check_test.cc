// The client library refuses a bad client string (common/client_strings.h)
// before it sends anything: these attaches name a socket where no daemon
// listens, so any answer other than INVALID_ARGUMENT naming the field, at
// once, means the library went looking for the daemon first.
#include <chrono>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gradd/client.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

ClientOptions NoDaemon() {
  ClientOptions options;
  options.socket_path = "/nonexistent/gradd-client-strings-test/gradd.sock";
  options.job_id = "job";
  options.local_rank = 0;
  options.local_world_size = 1;
  options.connect_timeout = std::chrono::milliseconds(2000);
  return options;
}

std::vector<ClientParam> Params() {
  return {{"layer.weight", {4}, dtype::kFloat32, 0},
          {"layer.bias", {4}, dtype::kFloat32, 0}};
}

absl::Status AttachStatus(const ClientOptions& options,
                          const std::vector<ClientParam>& params) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = Client::Attach(options, params).status();
  // Refused on the spot, not after connect_timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            std::chrono::milliseconds(1000));
  return s;
}

TEST(ClientStringsCheckTest, RefusesBadStringsBeforeSending) {
  struct Case {
    const char* field;
    ClientOptions options;
    std::vector<ClientParam> params;
  };
  std::vector<Case> cases;
  {
    Case c{"job_id 'evil\\n2030", NoDaemon(), Params()};
    c.options.job_id = "evil\n2030-01-01T00:00:00.000000Z I gradd: forged";
    cases.push_back(c);
  }
  {
    Case c{"params[1].name is not valid UTF-8: byte 4 is 0xFF", NoDaemon(),
           Params()};
    c.params[1].name = "bias\xff";
    cases.push_back(c);
  }
  {
    Case c{"params[0].name is 5000 bytes; the limit is 4096", NoDaemon(),
           Params()};
    c.params[0].name = std::string(5000, 'w');
    cases.push_back(c);
  }
  {
    Case c{"node_id 'n\\x1b[0m'", NoDaemon(), Params()};
    c.options.node_id = "n\x1b[0m";
    cases.push_back(c);
  }
  {
    Case c{"coordinator", NoDaemon(), Params()};
    c.options.coordinator = "host\r:29600";
    cases.push_back(c);
  }
  {
    Case c{"comm_hook.name", NoDaemon(), Params()};
    c.options.comm_hook.name = "fp16\xe2\x80\xa8";
    cases.push_back(c);
  }
  for (const Case& c : cases) {
    absl::Status s = AttachStatus(c.options, c.params);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.field)) << s;
  }
}

// The control: good strings get as far as looking for the daemon.
TEST(ClientStringsCheckTest, GoodStringsGoOnToTheDaemon) {
  ClientOptions options = NoDaemon();
  options.job_id = "caf\xc3\xa9-job";
  std::vector<ClientParam> params = Params();
  params[0].name = "\xe5\xb1\x82.weight";
  absl::Status s = Client::Attach(options, params).status();
  EXPECT_NE(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.code(), absl::StatusCode::kOk);
}

}  // namespace
}  // namespace gradd
