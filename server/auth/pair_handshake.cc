#include "server/auth/pair_handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradd {
namespace {

constexpr absl::string_view kHelloMagic = "gradd-p1";
constexpr absl::string_view kAck = "gradd-ok";
constexpr absl::string_view kLabel = "gradd-pair-v1";
static_assert(kHelloMagic.size() == 8 && kAck.size() == kPairAckBytes);

void AppendU32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>((v >> shift) & 0xff));
  }
}

uint32_t ReadU32(absl::string_view in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(in[i]);
  return v;
}

absl::StatusOr<std::string> RandomBytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()),
                 static_cast<int>(n)) != 1) {
    return absl::InternalError(
        "the pair handshake could not draw random bytes (RAND_bytes failed)");
  }
  return out;
}

bool SameBytes(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() &&
         CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::Status CheckKey(absl::string_view key) {
  if (key.size() != kPairKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a pair key has ", kPairKeyBytes, " bytes, not ", key.size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> RandomPairKey() {
  return RandomBytes(kPairKeyBytes);
}

bool CouldBePairHello(absl::string_view received) {
  const size_t n = std::min(received.size(), kHelloMagic.size());
  return received.substr(0, n) == kHelloMagic.substr(0, n);
}

std::string PairProof(absl::string_view key, char role, uint32_t client_rank,
                      uint32_t server_rank, absl::string_view nonce_c,
                      absl::string_view nonce_s) {
  std::string message(kLabel);
  message.push_back(role);
  AppendU32(message, client_rank);
  AppendU32(message, server_rank);
  absl::StrAppend(&message, nonce_c, nonce_s);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(),
       mac, &mac_len);
  return std::string(reinterpret_cast<const char*>(mac), mac_len);
}

absl::StatusOr<PairHandshakeClient> PairHandshakeClient::Create(
    std::string key, uint32_t my_rank, uint32_t peer_rank) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  absl::StatusOr<std::string> nonce = RandomBytes(kPairNonceBytes);
  if (!nonce.ok()) return nonce.status();
  PairHandshakeClient out;
  out.key_ = std::move(key);
  out.my_rank_ = my_rank;
  out.peer_rank_ = peer_rank;
  out.nonce_c_ = *std::move(nonce);
  out.hello_ = std::string(kHelloMagic);
  AppendU32(out.hello_, my_rank);
  AppendU32(out.hello_, peer_rank);
  out.hello_ += out.nonce_c_;
  return out;
}

absl::StatusOr<std::string> PairHandshakeClient::OnReply(
    absl::string_view reply) {
  if (replied_) {
    return absl::FailedPreconditionError("a second reply in the handshake");
  }
  if (reply.size() != kPairReplyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a handshake reply has ", kPairReplyBytes, " bytes, not ",
                     reply.size()));
  }
  const absl::string_view nonce_s = reply.substr(0, kPairNonceBytes);
  const absl::string_view mac_s = reply.substr(kPairNonceBytes);
  if (!SameBytes(mac_s, PairProof(key_, 'S', my_rank_, peer_rank_, nonce_c_,
                                  nonce_s))) {
    return absl::UnauthenticatedError(
        "the listening side's proof of the job's pair key does not verify");
  }
  replied_ = true;
  return PairProof(key_, 'C', my_rank_, peer_rank_, nonce_c_, nonce_s);
}

absl::Status PairHandshakeClient::OnAck(absl::string_view ack) {
  if (!replied_) {
    return absl::FailedPreconditionError("an ack before the reply");
  }
  if (!SameBytes(ack, kAck)) {
    return absl::InvalidArgumentError("the handshake ack is malformed");
  }
  return absl::OkStatus();
}

absl::StatusOr<PairHandshakeServer> PairHandshakeServer::Create(
    std::string key, uint32_t my_rank, uint32_t peer_rank) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  absl::StatusOr<std::string> nonce = RandomBytes(kPairNonceBytes);
  if (!nonce.ok()) return nonce.status();
  PairHandshakeServer out;
  out.key_ = std::move(key);
  out.my_rank_ = my_rank;
  out.peer_rank_ = peer_rank;
  out.nonce_s_ = *std::move(nonce);
  return out;
}

absl::StatusOr<std::string> PairHandshakeServer::OnHello(
    absl::string_view hello) {
  if (hello_seen_) {
    return absl::FailedPreconditionError("a second hello in the handshake");
  }
  if (hello.size() != kPairHelloBytes ||
      hello.substr(0, kHelloMagic.size()) != kHelloMagic) {
    return absl::InvalidArgumentError(
        "the connection did not open with a gradd pair handshake");
  }
  const uint32_t client = ReadU32(hello.substr(8, 4));
  const uint32_t server = ReadU32(hello.substr(12, 4));
  if (client != peer_rank_ || server != my_rank_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the hello is for the pair of ranks ", client, " -> ", server,
        ", this is the pair ", peer_rank_, " -> ", my_rank_));
  }
  hello_seen_ = true;
  nonce_c_ = std::string(hello.substr(16, kPairNonceBytes));
  return absl::StrCat(
      nonce_s_, PairProof(key_, 'S', peer_rank_, my_rank_, nonce_c_, nonce_s_));
}

absl::StatusOr<std::string> PairHandshakeServer::OnFinish(
    absl::string_view finish) {
  if (!hello_seen_ || done_) {
    return absl::FailedPreconditionError("a proof out of turn");
  }
  if (finish.size() != kPairFinishBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a handshake proof has ", kPairFinishBytes, " bytes, not ",
                     finish.size()));
  }
  if (!SameBytes(finish, PairProof(key_, 'C', peer_rank_, my_rank_, nonce_c_,
                                   nonce_s_))) {
    return absl::UnauthenticatedError(
        "its proof of the job's pair key does not verify");
  }
  done_ = true;
  return std::string(kAck);
}

}  // namespace gradd
