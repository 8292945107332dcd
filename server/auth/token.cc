#include "server/auth/token.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/shm.h"
#include "spdlog/spdlog.h"

namespace gradd {
namespace {

constexpr size_t kMaxFileBytes = 1 << 20;

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     absl::string_view what, bool secret) {
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": empty path"));
  }
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    const int e = errno;
    const std::string msg =
        absl::StrCat(what, ": cannot open ", path, ": ", std::strerror(e));
    if (e == ENOENT) return absl::NotFoundError(msg);
    if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(msg);
    return absl::InvalidArgumentError(msg);
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", path, " is not a regular file"));
  }
  if (static_cast<size_t>(st.st_size) > kMaxFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", path, " is ", st.st_size,
                     " bytes; the limit is ", kMaxFileBytes));
  }
  if (secret && (st.st_mode & S_IROTH) != 0) {
    spdlog::warn(
        "{}: {} is readable by every user (mode {:04o}); chmod o-r it "
        "(systemd's LoadCredential= and the shipped Kubernetes Secret mount "
        "make it private)",
        std::string(what), path, st.st_mode & 07777);
  }
  std::string out;
  char buf[8192];
  while (true) {
    const ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": cannot read ", path, ": ", std::strerror(errno)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > kMaxFileBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", path, " is over ", kMaxFileBytes, " bytes"));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> ReadSecretFile(const std::string& path,
                                           absl::string_view what) {
  return ReadFile(path, what, /*secret=*/true);
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          absl::string_view what) {
  return ReadFile(path, what, /*secret=*/false);
}

TokenSet::Digest TokenSet::Hash(absl::string_view text) {
  Digest digest{};
  unsigned int len = 0;
  // EVP_Digest with SHA-256 cannot fail on valid input short of memory
  // exhaustion; a failure leaves the zero digest, which no token hashes to.
  EVP_Digest(text.data(), text.size(), digest.data(), &len, EVP_sha256(),
             nullptr);
  return digest;
}

absl::StatusOr<TokenSet> TokenSet::Parse(absl::string_view text,
                                         absl::string_view what) {
  TokenSet set;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripTrailingAsciiWhitespace(line);
    if (line.empty()) continue;
    if (line.size() < kMinTokenBytes || line.size() > kMaxTokenBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: line %d holds a token of %d characters; tokens must have "
          "%d..%d (e.g. `openssl rand -hex 32`)",
          what, line_number, line.size(), kMinTokenBytes, kMaxTokenBytes));
    }
    for (char c : line) {
      if (c < 0x21 || c > 0x7e) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: line %d holds a character that is not visible ASCII; "
            "tokens travel as gRPC metadata (use e.g. `openssl rand -hex "
            "32`)",
            what, line_number));
      }
    }
    if (set.sent_.empty()) set.sent_ = std::string(line);
    set.digests_.push_back(Hash(line));
  }
  if (set.digests_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": holds no token (an empty file?)"));
  }
  return set;
}

bool TokenSet::Accepts(absl::string_view presented) const {
  const Digest digest = Hash(presented);
  int matches = 0;
  for (const Digest& accepted : digests_) {
    matches |=
        CRYPTO_memcmp(digest.data(), accepted.data(), digest.size()) == 0;
  }
  return matches != 0;
}

}  // namespace gradd
