// NodeCredentials: what a gradd daemon proves to the other daemons and
// demands from them on the daemon <-> daemon network plane (the rendezvous
// store, served by the coordinator over TCP): mutual TLS
// (rendezvous.tls: certificate, key, CA) and/or a shared token
// (rendezvous.token_file). The rest of the daemon never sees the secrets:
// the rendezvous server asks for ServerCredentials() and CheckCall()s every
// call; the rendezvous client asks for ChannelCredentials(),
// ConfigureChannel() and AddToCall(). Nothing in the engine knows about
// credentials (docs/architecture.md).
//
//   TLS: the listener requires and verifies a client certificate signed by
//   the CA (gRPC's SSL credentials); the client verifies the coordinator's
//   certificate against the CA and its name (tls.server_name, else the
//   coordinator's host). Calls are encrypted.
//   Token: every call carries "authorization: Bearer <token>"; the server
//   compares it in constant time (token.h). Without TLS the token and the
//   calls travel in clear text: that authenticates the daemons against
//   strangers who cannot read the network, not against those who can, so
//   use TLS (with or without a token) on networks you do not control.
//
// The token is checked in CheckCall rather than by a gRPC
// AuthMetadataProcessor because gRPC 1.51 (Debian 12) cannot attach one to
// plaintext (insecure) server credentials - it aborts the process - and one
// check serves both transports.
//
// Reload() (SIGHUP) re-reads every file and checks it; on any error the old
// material stays in force and the error is returned. New TLS handshakes on
// a running listener use the new certificate and CA (a gRPC certificate
// config fetcher asks on every handshake), new channels use the new client
// material, and new calls are checked against the new token(s); connections
// already established stay up.
//
// Thread-safety: every method may be called from any thread. The object
// must outlive every gRPC server built with its ServerCredentials() (their
// handshakes call back into it): RendezvousServer keeps a reference.
#ifndef GRADD_SERVER_AUTH_NODE_CREDENTIALS_H_
#define GRADD_SERVER_AUTH_NODE_CREDENTIALS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gradd/v1/config.pb.h"
#include "grpc/grpc_security.h"
#include "grpcpp/grpcpp.h"
#include "server/auth/tls_material.h"
#include "server/auth/token.h"

namespace gradd {

struct NodeCredentialsOptions {
  // rendezvous.token_file; empty: no token.
  std::string token_file;
  // rendezvous.tls.*; all three empty: no TLS.
  TlsFiles tls;
  std::string tls_server_name;
};

NodeCredentialsOptions NodeCredentialsOptionsOf(
    const v1::RendezvousConfig& rendezvous);
// Whether the config names any credential (token_file or a tls file).
bool HasNodeCredentials(const v1::RendezvousConfig& rendezvous);

class NodeCredentials {
 public:
  // Reads and checks every file. INVALID_ARGUMENT when neither a token nor
  // TLS is configured, when only some TLS files are, or as TokenSet::Parse
  // and LoadTlsMaterial; NOT_FOUND / PERMISSION_DENIED for unreadable files.
  static absl::StatusOr<std::shared_ptr<NodeCredentials>> Load(
      NodeCredentialsOptions options);
  ~NodeCredentials();
  NodeCredentials(const NodeCredentials&) = delete;
  NodeCredentials& operator=(const NodeCredentials&) = delete;

  // Re-reads the files named at Load; see the header comment.
  absl::Status Reload();

  bool uses_tls() const { return !options_.tls.cert_file.empty(); }
  bool uses_token() const { return !options_.token_file.empty(); }
  // "mutual TLS (CN=node-a, expires ...) + token", for the log and
  // `graddctl status`. Never contains a secret.
  std::string Describe() const;

  // Server side. TLS: reloadable SSL credentials requiring a verified
  // client certificate; otherwise plaintext (the token is checked per call).
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials();
  // OK when the call carries what this daemon demands; UNAUTHENTICATED
  // naming the peer and what was missing or wrong (never a token).
  absl::Status CheckCall(const grpc::ServerContext& context) const;

  // Client side: credentials for a new channel (TLS: this daemon's
  // certificate and the CA; otherwise plaintext), the channel arguments
  // that go with them (the TLS name to check), and the per-call token.
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;
  void ConfigureChannel(grpc::ChannelArguments* args) const;
  void AddToCall(grpc::ClientContext* context) const;

 private:
  struct Material {
    std::optional<TokenSet> tokens;
    std::optional<TlsMaterial> tls;
  };
  // One per listener built from ServerCredentials(): what its handshakes
  // were last given.
  struct Fetcher {
    NodeCredentials* owner;
    uint64_t served_generation = 0;
  };
  class ReloadingServerCredentials;

  explicit NodeCredentials(NodeCredentialsOptions options);
  absl::StatusOr<Material> ReadMaterial() const;
  // gRPC's certificate config callback (grpc_ssl_server_certificate_config
  // _callback), on gRPC's handshake threads.
  static grpc_ssl_certificate_config_reload_status FetchCertificateConfig(
      void* fetcher, grpc_ssl_server_certificate_config** config);

  const NodeCredentialsOptions options_;
  mutable absl::Mutex mu_;
  Material material_ ABSL_GUARDED_BY(mu_);
  // Bumped by every successful Reload.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<std::unique_ptr<Fetcher>> fetchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradd

#endif  // GRADD_SERVER_AUTH_NODE_CREDENTIALS_H_
