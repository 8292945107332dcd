#include "common/client_strings.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(FindInvalidUtf8Test, AcceptsWellFormedText) {
  for (const char* text :
       {"", "layer1.weight", "caf\xc3\xa9", "\xe5\xb1\x82", "\xf0\x9f\x98\x80",
        "\xef\xbf\xbf", "\xf4\x8f\xbf\xbf", "\xed\x9f\xbf"}) {
    EXPECT_EQ(FindInvalidUtf8(text), absl::string_view::npos) << text;
  }
}

TEST(FindInvalidUtf8Test, FindsTheFirstBadByte) {
  struct Case {
    std::string text;
    size_t at;
  };
  for (const Case& c : std::vector<Case>{
           {"ab\xff", 2},            // never valid
           {"\xc3\x28", 0},          // bad continuation
           {"x\xc3", 1},             // truncated
           {"\xc0\xaf", 0},          // overlong '/'
           {"\xe0\x80\xaf", 0},      // overlong, 3 bytes
           {"\xf0\x80\x80\xaf", 0},  // overlong, 4 bytes
           {"ok\xed\xa0\x80", 2},    // surrogate U+D800
           {"\xf4\x90\x80\x80", 0},  // past U+10FFFF
           {"\xf5\x80\x80\x80", 0},  // no such lead byte
           {"a\xe5\xb1", 1},         // truncated 3-byte
           {"\x80", 0},              // lone continuation
       }) {
    EXPECT_EQ(FindInvalidUtf8(c.text), c.at) << c.text;
  }
}

TEST(CheckClientStringTest, AcceptsOrdinaryNames) {
  for (const char* text : {"job-7", "module.layers.0.weight", "h\xc3\xb4te:1",
                           "", "\xe5\xb1\x82.bias"}) {
    EXPECT_TRUE(CheckClientString("f", text, 64).ok()) << text;
  }
}

TEST(CheckClientStringTest, NamesTheFieldAndTheControlCharacter) {
  absl::Status s = CheckClientString("AttachRequest.job_id", "a\nb", 256);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("AttachRequest.job_id 'a\\nb'"),
                    HasSubstr("control character U+000A at byte 1")));
  // The message itself holds no raw control character.
  EXPECT_FALSE(NeedsEscapeForLog(s.message()));

  struct Case {
    std::string text;
    const char* what;
  };
  for (const Case& c : std::vector<Case>{
           {std::string("x\0y", 3), "control character U+0000 at byte 1"},
           {"\x1b[2J", "control character U+001B at byte 0"},
           {"del\x7f", "control character U+007F at byte 3"},
           {"nel\xc2\x85", "control character U+0085 at byte 3"},
           {"\xe2\x80\xa8", "line separator U+2028 at byte 0"},
           {"p\xe2\x80\xa9", "paragraph separator U+2029 at byte 1"},
           {"tab\there", "control character U+0009 at byte 3"},
       }) {
    absl::Status bad = CheckClientString("f", c.text, 64);
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(std::string(bad.message()), HasSubstr(c.what));
  }
}

TEST(CheckClientStringTest, InvalidUtf8NamesTheByte) {
  absl::Status s =
      CheckClientString("AttachRequest.params[1].name", "bias\xff", 4096);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("AttachRequest.params[1].name is not valid "
                              "UTF-8: byte 4 is 0xFF"),
                    HasSubstr("'bias\\xff'")));
}

TEST(CheckClientStringTest, OverTheLimitSaysBoth) {
  const std::string name(5000, 'p');
  absl::Status s = CheckClientString("params[0].name", name, 4096);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("params[0].name is 5000 bytes; the limit is "
                              "4096"),
                    HasSubstr("'...")));
  // The quote is cut: the message stays short.
  EXPECT_LT(s.message().size(), 200u);
  EXPECT_TRUE(CheckClientString("f", std::string(4096, 'p'), 4096).ok());
}

TEST(EscapeForLogTest, KeepsTextAndEscapesWhatBreaksALine) {
  EXPECT_EQ(EscapeForLog("job 'a' caf\xc3\xa9"), "job 'a' caf\xc3\xa9");
  EXPECT_FALSE(NeedsEscapeForLog("job 'a' caf\xc3\xa9 \\n"));
  EXPECT_EQ(EscapeForLog("a\nb\rc\td"), "a\\nb\\rc\\td");
  EXPECT_EQ(EscapeForLog("\x1b[31m\x7f"), "\\x1b[31m\\x7f");
  EXPECT_EQ(EscapeForLog("x\xc2\x85y\xe2\x80\xa8z"), "x\\u0085y\\u2028z");
  EXPECT_EQ(EscapeForLog("bad\xff\xc3"), "bad\\xff\\xc3");
  EXPECT_EQ(EscapeForLog(std::string("nul\0", 4)), "nul\\x00");
  for (const char* text : {"a\nb", "\xff", "\xc2\x85", "\xe2\x80\xa9"}) {
    EXPECT_TRUE(NeedsEscapeForLog(text)) << text;
    EXPECT_FALSE(NeedsEscapeForLog(EscapeForLog(text))) << text;
  }
}

}  // namespace
}  // namespace gradd
