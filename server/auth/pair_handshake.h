// The membership proof on a Gloo pair (docs/protocol.md, "Gloo pair
// handshake"): before any Gloo byte crosses a new TCP connection between two
// node daemons, both ends prove that they hold the job's pair key, a random
// 32-byte key that node rank 0 draws for every Gloo mesh of a job and
// publishes through the authenticated rendezvous store (so only daemons the
// coordinator let in can learn it).
//
//   client (connecting side)             server (listening side)
//   hello:  "gradd-p1" | client rank | server rank | nonce_c      (48 B)
//                                   reply:  nonce_s | mac_s        (64 B)
//   finish: mac_c                                                  (32 B)
//                                   ack:    "gradd-ok"             ( 8 B)
//
//   mac_x = HMAC-SHA256(key, "gradd-pair-v1" | role x ('S' or 'C') |
//                            client rank | server rank | nonce_c | nonce_s)
//
// Ranks are big-endian uint32. Both nonces are fresh from RAND_bytes, so a
// proof recorded on one connection is worthless on the next, and the role
// byte keeps a server's proof from being reflected back as a client's.
// Proofs are compared with CRYPTO_memcmp (constant time). This authenticates
// the two ends of the connection; it does not encrypt or integrity-protect
// the Gloo traffic that follows (Debian's Gloo has no TLS transport), so it
// keeps out strangers who can reach the pair ports, not an attacker who can
// rewrite packets on the path.
//
// These classes are pure state machines over byte strings (no sockets): the
// Gloo transport (backends/gloo/authenticated_tcp.h) moves the bytes.
//
// Errors: INVALID_ARGUMENT (a message of the wrong size or magic, ranks that
// do not match this pair, a key that is not kPairKeyBytes), UNAUTHENTICATED
// (a proof that does not verify), INTERNAL (no randomness),
// FAILED_PRECONDITION (a step out of order).
//
// Thread-safety: none; each object belongs to one connection.
#ifndef GRADD_SERVER_AUTH_PAIR_HANDSHAKE_H_
#define GRADD_SERVER_AUTH_PAIR_HANDSHAKE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradd {

inline constexpr size_t kPairKeyBytes = 32;
inline constexpr size_t kPairNonceBytes = 32;
inline constexpr size_t kPairMacBytes = 32;
inline constexpr size_t kPairHelloBytes = 8 + 4 + 4 + kPairNonceBytes;
inline constexpr size_t kPairReplyBytes = kPairNonceBytes + kPairMacBytes;
inline constexpr size_t kPairFinishBytes = kPairMacBytes;
inline constexpr size_t kPairAckBytes = 8;

// kPairKeyBytes from OpenSSL's RAND_bytes; INTERNAL when it fails.
[[nodiscard]] absl::StatusOr<std::string> RandomPairKey();

// Whether `received` (the first bytes of a connection, any length) can still
// be the start of a hello: lets a listener drop a stranger after 8 bytes.
bool CouldBePairHello(absl::string_view received);

// mac_x above. `role` is 'S' (server's proof) or 'C' (client's).
std::string PairProof(absl::string_view key, char role, uint32_t client_rank,
                      uint32_t server_rank, absl::string_view nonce_c,
                      absl::string_view nonce_s);

class PairHandshakeClient {
 public:
  // `my_rank` connects to `peer_rank`; draws nonce_c.
  [[nodiscard]] static absl::StatusOr<PairHandshakeClient> Create(
      std::string key, uint32_t my_rank, uint32_t peer_rank);

  // The first message (kPairHelloBytes).
  const std::string& hello() const { return hello_; }
  // Checks the server's reply (kPairReplyBytes); returns the finish message.
  [[nodiscard]] absl::StatusOr<std::string> OnReply(absl::string_view reply);
  // Checks the server's ack (kPairAckBytes): the server accepted our proof.
  [[nodiscard]] absl::Status OnAck(absl::string_view ack);

 private:
  PairHandshakeClient() = default;

  std::string key_;
  uint32_t my_rank_ = 0;
  uint32_t peer_rank_ = 0;
  std::string nonce_c_;
  std::string hello_;
  bool replied_ = false;
};

class PairHandshakeServer {
 public:
  // `my_rank` listens for `peer_rank`.
  [[nodiscard]] static absl::StatusOr<PairHandshakeServer> Create(
      std::string key, uint32_t my_rank, uint32_t peer_rank);

  // Checks the client's hello (kPairHelloBytes); returns the reply.
  [[nodiscard]] absl::StatusOr<std::string> OnHello(absl::string_view hello);
  // Checks the client's proof (kPairFinishBytes); returns the ack. Only
  // after this returned OK may the connection carry Gloo traffic.
  [[nodiscard]] absl::StatusOr<std::string> OnFinish(absl::string_view finish);

 private:
  PairHandshakeServer() = default;

  std::string key_;
  uint32_t my_rank_ = 0;
  uint32_t peer_rank_ = 0;
  std::string nonce_c_;
  std::string nonce_s_;
  bool hello_seen_ = false;
  bool done_ = false;
};

}  // namespace gradd

#endif  // GRADD_SERVER_AUTH_PAIR_HANDSHAKE_H_
