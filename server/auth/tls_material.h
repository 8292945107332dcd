// The PEM files of mutual TLS between daemons (rendezvous.tls), read and
// checked before gRPC sees them, so a wrong file stops the daemon (or a
// SIGHUP reload) with an error naming the config key and the reason instead
// of failing every later handshake with "certificate verify failed":
//   - cert_file: this daemon's certificate, then any intermediates;
//   - key_file: its private key, which must match the certificate;
//   - ca_file: the CA certificate(s); the certificate must verify against
//     them now (so it is also inside its validity period) and be usable
//     both as a TLS server and as a TLS client, since every daemon is both.
//
// Thread-safety: a plain function.
#ifndef GRADD_SERVER_AUTH_TLS_MATERIAL_H_
#define GRADD_SERVER_AUTH_TLS_MATERIAL_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gradd {

struct TlsFiles {
  std::string cert_file;
  std::string key_file;
  std::string ca_file;
};

struct TlsMaterial {
  std::string cert_chain_pem;
  std::string private_key_pem;
  std::string ca_pem;
  // For the log: the certificate's subject and when it expires.
  std::string subject;
  absl::Time not_after;
};

// INVALID_ARGUMENT / NOT_FOUND / PERMISSION_DENIED naming the key
// (rendezvous.tls.cert_file, ...), the file and what is wrong.
absl::StatusOr<TlsMaterial> LoadTlsMaterial(const TlsFiles& files);

}  // namespace gradd

#endif  // GRADD_SERVER_AUTH_TLS_MATERIAL_H_
