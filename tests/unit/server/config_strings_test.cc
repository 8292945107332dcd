// Config strings follow the client-string rules (issue 20; found by
// tests/fuzz/config_fuzzer.cc): a node id with a NUL, a line separator or
// bytes that are not UTF-8 was accepted, then printed (--print-config)
// differently from what the daemon used, logged and sent to other daemons.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(ConfigStringsTest, ControlCharactersAndBadUtf8AreRefusedNamingTheKey) {
  struct Case {
    std::string yaml;
    const char* what;
  };
  for (const Case& c : std::vector<Case>{
           {"node_id: \"a\\u2028b\"\n", "line separator U+2028 at byte 1"},
           {"node_id: \"a\\0b\"\n", "control character U+0000 at byte 1"},
           {"rendezvous:\n  coordinator_address: \"h\\tx:1\"\n",
            "control character U+0009"},
           {std::string("socket_path: \"/tmp/g\xff.sock\"\n"),
            "is not valid UTF-8: byte 6 is 0xFF"},
       }) {
    absl::StatusOr<v1::DaemonConfig> config = ParseConfigYaml(c.yaml, "t.yaml");
    ASSERT_FALSE(config.ok()) << c.yaml;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(config.status().message()),
                AllOf(HasSubstr("t.yaml:"), HasSubstr(c.what)));
  }
}

TEST(ConfigStringsTest, Utf8TextIsAccepted) {
  absl::StatusOr<v1::DaemonConfig> config =
      ParseConfigYaml("node_id: \"n\xc5\x93ud-1\"\n", "t.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->node_id(), "n\xc5\x93ud-1");
}

}  // namespace
}  // namespace gradd
