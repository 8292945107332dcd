#include "server/auth/node_credentials.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "grpc/grpc.h"

namespace gradd {
namespace {

constexpr char kAuthorizationKey[] = "authorization";
constexpr char kBearer[] = "Bearer ";

}  // namespace

NodeCredentialsOptions NodeCredentialsOptionsOf(
    const v1::RendezvousConfig& rv) {
  NodeCredentialsOptions o;
  o.token_file = rv.token_file();
  o.tls.cert_file = rv.tls().cert_file();
  o.tls.key_file = rv.tls().key_file();
  o.tls.ca_file = rv.tls().ca_file();
  o.tls_server_name = rv.tls().server_name();
  return o;
}

bool HasNodeCredentials(const v1::RendezvousConfig& rv) {
  return !rv.token_file().empty() || !rv.tls().cert_file().empty() ||
         !rv.tls().key_file().empty() || !rv.tls().ca_file().empty();
}

// gRPC SSL server credentials whose certificate, key and CA come from a
// NodeCredentials on every handshake (gRPC's certificate config fetcher), so
// a Reload reaches a running listener. grpc::ServerCredentials has no public
// constructor for a core credential, so this implements its port hook the
// way gRPC's own credentials do: core credentials added to the core server.
class NodeCredentials::ReloadingServerCredentials final
    : public grpc::ServerCredentials {
 public:
  explicit ReloadingServerCredentials(Fetcher* fetcher) : fetcher_(fetcher) {}

  // Metadata is checked per call (NodeCredentials::CheckCall), never by a
  // processor; gradd does not install one.
  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& processor) override {
    (void)processor;
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    grpc_ssl_server_credentials_options* options =
        grpc_ssl_server_credentials_create_options_using_config_fetcher(
            GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY,
            &NodeCredentials::FetchCertificateConfig, fetcher_);
    // Takes ownership of `options`.
    grpc_server_credentials* creds =
        grpc_ssl_server_credentials_create_with_options(options);
    if (creds == nullptr) return 0;
    const int port = grpc_server_add_http2_port(server, addr.c_str(), creds);
    grpc_server_credentials_release(creds);
    return port;
  }

  Fetcher* const fetcher_;  // owned by the NodeCredentials, which outlives us
};

NodeCredentials::NodeCredentials(NodeCredentialsOptions options)
    : options_(std::move(options)) {}

NodeCredentials::~NodeCredentials() = default;

absl::StatusOr<std::shared_ptr<NodeCredentials>> NodeCredentials::Load(
    NodeCredentialsOptions options) {
  const TlsFiles& tls = options.tls;
  const bool any_tls =
      !tls.cert_file.empty() || !tls.key_file.empty() || !tls.ca_file.empty();
  if (any_tls) {
    std::vector<std::string> missing;
    if (tls.cert_file.empty()) missing.push_back("rendezvous.tls.cert_file");
    if (tls.key_file.empty()) missing.push_back("rendezvous.tls.key_file");
    if (tls.ca_file.empty()) missing.push_back("rendezvous.tls.ca_file");
    if (!missing.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mutual TLS needs rendezvous.tls.cert_file, key_file and ca_file "
          "together; missing: ",
          absl::StrJoin(missing, ", ")));
    }
  } else if (!options.tls_server_name.empty()) {
    return absl::InvalidArgumentError(
        "rendezvous.tls.server_name is set but rendezvous.tls.cert_file, "
        "key_file and ca_file are not");
  }
  if (!any_tls && options.token_file.empty()) {
    return absl::InvalidArgumentError(
        "no daemon credentials configured: set rendezvous.token_file and/or "
        "rendezvous.tls (cert_file, key_file, ca_file)");
  }
  std::shared_ptr<NodeCredentials> creds(
      new NodeCredentials(std::move(options)));
  ASSIGN_OR_RETURN(Material material, creds->ReadMaterial());
  absl::MutexLock lock(&creds->mu_);
  creds->material_ = std::move(material);
  return creds;
}

absl::StatusOr<NodeCredentials::Material> NodeCredentials::ReadMaterial()
    const {
  Material m;
  if (uses_token()) {
    const std::string what =
        absl::StrCat("rendezvous.token_file ", options_.token_file);
    ASSIGN_OR_RETURN(std::string text, ReadSecretFile(options_.token_file,
                                                      "rendezvous.token_file"));
    ASSIGN_OR_RETURN(m.tokens, TokenSet::Parse(text, what));
  }
  if (uses_tls()) {
    ASSIGN_OR_RETURN(m.tls, LoadTlsMaterial(options_.tls));
  }
  return m;
}

absl::Status NodeCredentials::Reload() {
  ASSIGN_OR_RETURN(Material material, ReadMaterial());
  absl::MutexLock lock(&mu_);
  material_ = std::move(material);
  ++generation_;
  return absl::OkStatus();
}

std::string NodeCredentials::Describe() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> parts;
  if (material_.tls.has_value()) {
    parts.push_back(
        absl::StrCat("mutual TLS (", material_.tls->subject, ", expires ",
                     absl::FormatTime("%Y-%m-%d", material_.tls->not_after,
                                      absl::UTCTimeZone()),
                     ")"));
  }
  if (material_.tokens.has_value()) {
    parts.push_back(material_.tls.has_value()
                        ? std::string("token")
                        : std::string("token (calls not encrypted)"));
  }
  return absl::StrJoin(parts, " + ");
}

grpc_ssl_certificate_config_reload_status
NodeCredentials::FetchCertificateConfig(
    void* fetcher, grpc_ssl_server_certificate_config** config) {
  Fetcher* f = static_cast<Fetcher*>(fetcher);
  NodeCredentials* self = f->owner;
  absl::MutexLock lock(&self->mu_);
  if (!self->material_.tls.has_value()) {
    return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
  }
  if (f->served_generation == self->generation_) {
    return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
  }
  const TlsMaterial& tls = *self->material_.tls;
  grpc_ssl_pem_key_cert_pair pair{tls.private_key_pem.c_str(),
                                  tls.cert_chain_pem.c_str()};
  // Copies the strings; gRPC owns the config from here on.
  *config =
      grpc_ssl_server_certificate_config_create(tls.ca_pem.c_str(), &pair, 1);
  if (*config == nullptr) return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
  f->served_generation = self->generation_;
  return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
}

std::shared_ptr<grpc::ServerCredentials> NodeCredentials::ServerCredentials() {
  if (!uses_tls()) return grpc::InsecureServerCredentials();
  absl::MutexLock lock(&mu_);
  fetchers_.push_back(std::make_unique<Fetcher>(Fetcher{this}));
  return std::make_shared<ReloadingServerCredentials>(fetchers_.back().get());
}

absl::Status NodeCredentials::CheckCall(
    const grpc::ServerContext& context) const {
  auto refuse = [&](absl::string_view why) {
    return absl::UnauthenticatedError(absl::StrCat(
        "rendezvous call from ", context.peer(), " refused: ", why));
  };
  if (uses_tls()) {
    std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
    if (auth == nullptr || !auth->IsPeerAuthenticated()) {
      return refuse(
          "it presented no client certificate signed by this daemon's "
          "rendezvous.tls.ca_file");
    }
  }
  if (!uses_token()) return absl::OkStatus();
  std::shared_ptr<const TokenSet> tokens;
  std::optional<std::string> presented;
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find(kAuthorizationKey); it != metadata.end()) {
    const absl::string_view value(it->second.data(), it->second.size());
    if (absl::StartsWith(value, kBearer)) {
      presented = std::string(value.substr(sizeof(kBearer) - 1));
    }
  }
  if (!presented.has_value()) {
    return refuse(
        "it presented no token; this daemon requires the token of "
        "rendezvous.token_file");
  }
  bool accepted = false;
  {
    absl::MutexLock lock(&mu_);
    accepted =
        material_.tokens.has_value() && material_.tokens->Accepts(*presented);
  }
  if (!accepted) {
    return refuse(
        "it presented a wrong token (not one in this daemon's "
        "rendezvous.token_file)");
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::ChannelCredentials> NodeCredentials::ChannelCredentials()
    const {
  absl::MutexLock lock(&mu_);
  if (!material_.tls.has_value()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = material_.tls->ca_pem;
  o.pem_private_key = material_.tls->private_key_pem;
  o.pem_cert_chain = material_.tls->cert_chain_pem;
  return grpc::SslCredentials(o);
}

void NodeCredentials::ConfigureChannel(grpc::ChannelArguments* args) const {
  if (uses_tls() && !options_.tls_server_name.empty()) {
    args->SetSslTargetNameOverride(options_.tls_server_name);
  }
}

void NodeCredentials::AddToCall(grpc::ClientContext* context) const {
  if (!uses_token()) return;
  absl::MutexLock lock(&mu_);
  if (!material_.tokens.has_value()) return;
  context->AddMetadata(kAuthorizationKey,
                       absl::StrCat(kBearer, material_.tokens->sent()));
}

}  // namespace gradd
