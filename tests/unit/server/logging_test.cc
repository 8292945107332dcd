#include "server/logging.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

TEST(LoggingTest, AcceptsTheDocumentedLevels) {
  for (const char* level :
       {"trace", "debug", "info", "warning", "warn", "error", "off", "INFO"}) {
    EXPECT_TRUE(InitLogging(level, LogDestination::kStderr).ok()) << level;
  }
  ASSERT_TRUE(InitLogging("warning", LogDestination::kStderr).ok());
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::warn);
}

TEST(LoggingTest, UnknownLevelIsAnErrorNamingTheChoices) {
  absl::Status s = InitLogging("loud", LogDestination::kStderr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'loud'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("warning"));
}

TEST(LoggingTest, JournalStreamMustNameOurStderr) {
  unsetenv("JOURNAL_STREAM");
  EXPECT_FALSE(StderrIsJournal());
  struct stat st;
  ASSERT_EQ(fstat(2, &st), 0);
  setenv("JOURNAL_STREAM", absl::StrCat(st.st_dev, ":", st.st_ino).c_str(), 1);
  EXPECT_TRUE(StderrIsJournal());
  setenv("JOURNAL_STREAM", absl::StrCat(st.st_dev, ":", st.st_ino + 1).c_str(),
         1);
  EXPECT_FALSE(StderrIsJournal());
  setenv("JOURNAL_STREAM", "garbage", 1);
  EXPECT_FALSE(StderrIsJournal());
  unsetenv("JOURNAL_STREAM");
}

// Lines on stderr carry a UTC timestamp and the level; lines below the
// level are dropped.
TEST(LoggingTest, StderrLinesHaveTimestampAndLevel) {
  char path[] = "/tmp/gradd_logging_testXXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const int saved = dup(2);
  ASSERT_GE(saved, 0);
  ASSERT_EQ(dup2(fd, 2), 2);
  ASSERT_TRUE(InitLogging("info", LogDestination::kStderr).ok());
  spdlog::debug("not shown");
  spdlog::warn("job '{}' is slow", "j1");
  spdlog::default_logger()->flush();
  dup2(saved, 2);
  close(saved);
  close(fd);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path);
  EXPECT_THAT(text.str(),
              MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}\\.[0-9]{6}Z W "
                           "gradd: job 'j1' is slow\n"));
}

// Issue 20: a client string with a newline (or other control characters,
// or bytes that are not UTF-8) cannot add a line of its own.
TEST(LoggingTest, EveryMessageStaysOneEscapedLine) {
  char path[] = "/tmp/gradd_logging_testXXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const int saved = dup(2);
  ASSERT_GE(saved, 0);
  ASSERT_EQ(dup2(fd, 2), 2);
  ASSERT_TRUE(InitLogging("info", LogDestination::kStderr).ok());
  const std::string job =
      "x\n2030-01-01T00:00:00.000000Z I gradd: forged\x1b[2J\xff";
  spdlog::warn("job '{}': attach failed", job);
  spdlog::info("caf\xc3\xa9 stays");
  spdlog::default_logger()->flush();
  dup2(saved, 2);
  close(saved);
  close(fd);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path);
  EXPECT_THAT(text.str(),
              MatchesRegex("[0-9T:.Z-]+ W gradd: job 'x\\\\n2030-01-01T00:00:00"
                           "\\.000000Z I gradd: forged\\\\x1b\\[2J\\\\xff': "
                           "attach failed\n[0-9T:.Z-]+ I gradd: caf\xc3\xa9 "
                           "stays\n"));
}

}  // namespace
}  // namespace gradd
