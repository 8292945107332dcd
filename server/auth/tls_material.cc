#include "server/auth/tls_material.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/auth/token.h"

namespace gradd {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct StoreFree {
  void operator()(X509_STORE* s) const { X509_STORE_free(s); }
};
struct StoreCtxFree {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};
struct StackFree {
  void operator()(STACK_OF(X509) * s) const { sk_X509_free(s); }
};
using UniqueX509 = std::unique_ptr<X509, X509Free>;

// OpenSSL's queued errors as text (and clears them).
std::string OpenSslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out.empty() ? std::string("no PEM data found") : out;
}

std::unique_ptr<BIO, BioFree> MemoryBio(const std::string& text) {
  return std::unique_ptr<BIO, BioFree>(
      BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// Every certificate in `pem`, in order. INVALID_ARGUMENT if none parses.
absl::StatusOr<std::vector<UniqueX509>> ParseCertificates(
    const std::string& pem, const std::string& what) {
  ERR_clear_error();
  std::vector<UniqueX509> certs;
  auto bio = MemoryBio(pem);
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(x);
  }
  // The loop ends on "no start line" after the last certificate.
  if (certs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " holds no PEM certificate (", OpenSslErrors(), ")"));
  }
  ERR_clear_error();
  return certs;
}

std::string Subject(X509* cert) {
  char buf[512];
  X509_NAME_oneline(X509_get_subject_name(cert), buf, sizeof(buf));
  return buf;
}

absl::Time NotAfter(X509* cert) {
  ASN1_TIME* epoch = ASN1_TIME_set(nullptr, 0);
  int days = 0;
  int seconds = 0;
  absl::Time t = absl::InfiniteFuture();
  if (epoch != nullptr &&
      ASN1_TIME_diff(&days, &seconds, epoch, X509_get0_notAfter(cert)) == 1) {
    t = absl::FromUnixSeconds(int64_t{days} * 86400 + seconds);
  }
  ASN1_TIME_free(epoch);
  return t;
}

}  // namespace

absl::StatusOr<TlsMaterial> LoadTlsMaterial(const TlsFiles& files) {
  const std::string cert_what =
      absl::StrCat("rendezvous.tls.cert_file ", files.cert_file);
  const std::string key_what =
      absl::StrCat("rendezvous.tls.key_file ", files.key_file);
  const std::string ca_what =
      absl::StrCat("rendezvous.tls.ca_file ", files.ca_file);
  TlsMaterial m;
  ASSIGN_OR_RETURN(m.cert_chain_pem,
                   ReadSmallFile(files.cert_file, "rendezvous.tls.cert_file"));
  ASSIGN_OR_RETURN(m.private_key_pem,
                   ReadSecretFile(files.key_file, "rendezvous.tls.key_file"));
  ASSIGN_OR_RETURN(m.ca_pem,
                   ReadSmallFile(files.ca_file, "rendezvous.tls.ca_file"));

  ASSIGN_OR_RETURN(std::vector<UniqueX509> chain,
                   ParseCertificates(m.cert_chain_pem, cert_what));
  ASSIGN_OR_RETURN(std::vector<UniqueX509> cas,
                   ParseCertificates(m.ca_pem, ca_what));
  X509* leaf = chain.front().get();

  ERR_clear_error();
  auto key_bio = MemoryBio(m.private_key_pem);
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_what,
                     " holds no unencrypted PEM private key (the daemon "
                     "cannot ask for a passphrase)"));
  }
  if (X509_check_private_key(leaf, key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(key_what, " is not the private key of the certificate in ",
                     cert_what, " (", Subject(leaf), ")"));
  }

  // Verify against the CA now, with the file's intermediates.
  std::unique_ptr<X509_STORE, StoreFree> store(X509_STORE_new());
  for (const UniqueX509& ca : cas) X509_STORE_add_cert(store.get(), ca.get());
  std::unique_ptr<STACK_OF(X509), StackFree> intermediates(sk_X509_new_null());
  for (size_t i = 1; i < chain.size(); ++i) {
    sk_X509_push(intermediates.get(), chain[i].get());
  }
  std::unique_ptr<X509_STORE_CTX, StoreCtxFree> ctx(X509_STORE_CTX_new());
  if (store == nullptr || intermediates == nullptr || ctx == nullptr ||
      X509_STORE_CTX_init(ctx.get(), store.get(), leaf, intermediates.get()) !=
          1) {
    return absl::ResourceExhaustedError(
        absl::StrCat("checking ", cert_what, ": ", OpenSslErrors()));
  }
  if (X509_verify_cert(ctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("the certificate in ", cert_what, " (", Subject(leaf),
                     ") does not verify against ", ca_what, ": ",
                     X509_verify_cert_error_string(err)));
  }
  for (auto [purpose, role] :
       {std::pair<int, const char*>{X509_PURPOSE_SSL_SERVER, "server"},
        {X509_PURPOSE_SSL_CLIENT, "client"}}) {
    if (X509_check_purpose(leaf, purpose, 0) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat(
          "the certificate in ", cert_what, " may not be used as a TLS ", role,
          "; every daemon is both (extendedKeyUsage = serverAuth, "
          "clientAuth)"));
    }
  }
  m.subject = Subject(leaf);
  m.not_after = NotAfter(leaf);
  return m;
}

}  // namespace gradd
