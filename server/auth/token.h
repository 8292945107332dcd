// Shared-secret tokens for daemon <-> daemon calls (rendezvous.token_file):
// reading a secret file and checking a presented token in constant time.
//
// A token file holds one token per line: the first non-empty line is the
// token this daemon sends, every non-empty line is accepted from callers,
// so a new token can be rolled out to every node before the old one is
// removed. Tokens are 16..4096 visible ASCII characters (they travel as
// gRPC metadata); trailing spaces and CRs are ignored.
//
// Only SHA-256 digests of the accepted tokens are kept; a presented token is
// hashed and compared with every digest by CRYPTO_memcmp (OpenSSL's
// constant-time compare), without stopping at a match. Hashing first makes
// the comparison independent of the presented length, which a plain
// constant-time memcmp of different-length strings would leak. Error
// messages name the file and the line, never a token.
//
// Thread-safety: a TokenSet is immutable after Parse; Accepts is safe from
// any thread.
#ifndef GRADD_SERVER_AUTH_TOKEN_H_
#define GRADD_SERVER_AUTH_TOKEN_H_

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradd {

inline constexpr size_t kMinTokenBytes = 16;
inline constexpr size_t kMaxTokenBytes = 4096;

class TokenSet {
 public:
  // Parses a token file's text. `what` names it in errors (e.g.
  // "rendezvous.token_file /etc/gradd/token"). INVALID_ARGUMENT when there
  // is no token or a line is too short, too long or not visible ASCII.
  static absl::StatusOr<TokenSet> Parse(absl::string_view text,
                                        absl::string_view what);

  // The token this daemon presents to others.
  const std::string& sent() const { return sent_; }
  // Whether `presented` is one of the accepted tokens (constant time in
  // the contents of both).
  bool Accepts(absl::string_view presented) const;
  size_t num_accepted() const { return digests_.size(); }

 private:
  using Digest = std::array<unsigned char, 32>;
  static Digest Hash(absl::string_view text);

  std::string sent_;
  std::vector<Digest> digests_;
};

// Reads a secret file (token, private key): NOT_FOUND / PERMISSION_DENIED /
// INVALID_ARGUMENT naming `what` and the path, never the contents. Files
// over 1 MiB are refused (a secret is never that large; /dev/zero is not a
// secret). A world-readable file is accepted with a warning in the log
// (group-readable is how Kubernetes hands a Secret to a pod's fsGroup).
absl::StatusOr<std::string> ReadSecretFile(const std::string& path,
                                           absl::string_view what);
// The same for files that are not secret (certificates): no mode warning.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          absl::string_view what);

}  // namespace gradd

#endif  // GRADD_SERVER_AUTH_TOKEN_H_
