// Shared-secret tokens (server/auth/token.h): parsing a token file, the
// accepted set, and reading secret files.
#include "server/auth/token.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "tests/unit/auth/test_certs.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";
constexpr char kNext[] = "fedcba9876543210fedcba9876543210";

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(TokenSetTest, FirstLineIsSentEveryLineIsAccepted) {
  absl::StatusOr<TokenSet> set =
      TokenSet::Parse(absl::StrCat(kToken, "\r\n\n  \n", kNext, "  \n"), "t");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->sent(), kToken);
  EXPECT_EQ(set->num_accepted(), 2u);
  EXPECT_TRUE(set->Accepts(kToken));
  EXPECT_TRUE(set->Accepts(kNext));
}

TEST(TokenSetTest, RefusesWhatIsNotExactlyAnAcceptedToken) {
  absl::StatusOr<TokenSet> set = TokenSet::Parse(kToken, "t");
  ASSERT_TRUE(set.ok());
  const std::string token = kToken;
  EXPECT_FALSE(set->Accepts(""));
  EXPECT_FALSE(set->Accepts(token.substr(0, token.size() - 1)));  // prefix
  EXPECT_FALSE(set->Accepts(token + "0"));                        // longer
  std::string flipped = token;
  flipped[7] ^= 1;
  EXPECT_FALSE(set->Accepts(flipped));
  EXPECT_FALSE(set->Accepts(kNext));
}

TEST(TokenSetTest, BadFilesNameTheLineButNeverTheToken) {
  absl::StatusOr<TokenSet> empty = TokenSet::Parse("\n \n", "file F");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(empty.status()), HasSubstr("file F: holds no token"));

  absl::StatusOr<TokenSet> short_line =
      TokenSet::Parse(absl::StrCat(kToken, "\nshort-secret\n"), "file F");
  EXPECT_EQ(short_line.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(short_line.status()),
              AllOf(HasSubstr("line 2"), HasSubstr("12 characters"),
                    Not(HasSubstr("short-secret")), Not(HasSubstr(kToken))));

  absl::StatusOr<TokenSet> spaced =
      TokenSet::Parse("0123456789 abcdef0123456789", "file F");
  EXPECT_THAT(Message(spaced.status()),
              AllOf(HasSubstr("line 1"), HasSubstr("not visible ASCII"),
                    Not(HasSubstr("0123456789"))));
  EXPECT_FALSE(TokenSet::Parse(std::string(kMaxTokenBytes + 1, 'x'), "f").ok());
  EXPECT_TRUE(TokenSet::Parse(std::string(kMaxTokenBytes, 'x'), "f").ok());
}

TEST(ReadSecretFileTest, MissingUnreadableAndHugeFilesAreClearErrors) {
  testing::TempDir temp("gradd-token-");
  ASSERT_FALSE(temp.path().empty());
  const std::string& dir = temp.path();
  absl::StatusOr<std::string> missing =
      ReadSecretFile(dir + "/nope", "rendezvous.token_file");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(missing.status()),
              AllOf(HasSubstr("rendezvous.token_file"), HasSubstr("/nope")));
  EXPECT_EQ(ReadSecretFile(dir, "k").status().code(),
            absl::StatusCode::kInvalidArgument);  // a directory
  EXPECT_EQ(ReadSecretFile("/dev/zero", "k").status().code(),
            absl::StatusCode::kInvalidArgument);  // not a regular file
  ASSERT_TRUE(testing::WriteSecret(dir + "/big", std::string(2 << 20, 'x')));
  EXPECT_THAT(Message(ReadSecretFile(dir + "/big", "k").status()),
              HasSubstr("the limit is"));
  ASSERT_TRUE(testing::WriteSecret(dir + "/token", kToken));
  absl::StatusOr<std::string> ok = ReadSecretFile(dir + "/token", "k");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, kToken);
}

}  // namespace
}  // namespace gradd
