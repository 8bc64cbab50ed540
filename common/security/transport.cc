#include "common/security/transport.h"

#include <arpa/inet.h>
#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/metrics/metrics.h"
#include "common/util/file_util.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"

namespace tandem::security {
namespace {

constexpr Role kAllRoles[] = {Role::kRouter, Role::kPrefill, Role::kDecode, Role::kCacheStore};

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using BioPtr = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using X509Ptr = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using KeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using StorePtr = std::unique_ptr<X509_STORE, Deleter<X509_STORE, X509_STORE_free>>;
using StoreCtxPtr = std::unique_ptr<X509_STORE_CTX, Deleter<X509_STORE_CTX, X509_STORE_CTX_free>>;

BioPtr MemoryBio(const std::string& text) {
  return BioPtr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("security.tls.", what, ": ", text.status().message()));
  }
  if (text->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("security.tls.", what, ": ", path, " holds no PEM block"));
  }
  return text;
}

std::vector<std::string> UriSans(X509* cert) {
  std::vector<std::string> uris;
  auto* names =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (names == nullptr) return uris;
  for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    if (name->type != GEN_URI) continue;
    const ASN1_IA5STRING* uri = name->d.uniformResourceIdentifier;
    uris.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(uri)),
                      static_cast<size_t>(ASN1_STRING_length(uri)));
  }
  GENERAL_NAMES_free(names);
  return uris;
}

// A store of the CA certificates in `pem`; null when it holds none.
StorePtr StoreFromPem(const std::string& pem) {
  StorePtr store(X509_STORE_new());
  BioPtr bio = MemoryBio(pem);
  int added = 0;
  while (X509* c = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(store.get(), c);
    X509_free(c);
    ++added;
  }
  return added > 0 ? std::move(store) : nullptr;
}

// X509_V_OK when `leaf` chains to a CA of `store` now, through certificates of `chain_pem`
// (which may hold the leaf too); else OpenSSL's verification error.
int VerifyChain(X509_STORE* store, X509* leaf, const std::string& chain_pem) {
  STACK_OF(X509)* chain = sk_X509_new_null();
  BioPtr bio = MemoryBio(chain_pem);
  while (X509* c = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) sk_X509_push(chain, c);
  StoreCtxPtr ctx(X509_STORE_CTX_new());
  X509_STORE_CTX_init(ctx.get(), store, leaf, chain);
  const bool verified = X509_verify_cert(ctx.get()) == 1;
  const int error = X509_STORE_CTX_get_error(ctx.get());
  sk_X509_pop_free(chain, X509_free);
  if (verified) return X509_V_OK;
  return error == X509_V_OK ? X509_V_ERR_UNSPECIFIED : error;
}

// The checks Create makes of the files before gRPC ever reads them: the certificate parses,
// matches the key, chains to the CA now, and names a role. Returns the role.
absl::StatusOr<Role> CheckFiles(const TransportOptions& o) {
  TANDEM_ASSIGN_OR_RETURN(std::string ca, ReadPem(o.ca_file, "ca_file"));
  TANDEM_ASSIGN_OR_RETURN(std::string cert_pem, ReadPem(o.cert_file, "cert_file"));
  TANDEM_ASSIGN_OR_RETURN(std::string key_pem, ReadPem(o.key_file, "key_file"));
  X509Ptr cert(PEM_read_bio_X509(MemoryBio(cert_pem).get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("security.tls.cert_file: ", o.cert_file, " holds no certificate"));
  }
  KeyPtr key(PEM_read_bio_PrivateKey(MemoryBio(key_pem).get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("security.tls.key_file: ", o.key_file, " holds no private key"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("security.tls.key_file: ", o.key_file, " is not the key of ", o.cert_file));
  }
  StorePtr store = StoreFromPem(ca);
  if (store == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("security.tls.ca_file: ", o.ca_file, " holds no certificate"));
  }
  // Intermediates may follow the leaf in cert_file.
  const int error = VerifyChain(store.get(), cert.get(), cert_pem);
  if (error != X509_V_OK) {
    return absl::InvalidArgumentError(absl::StrCat("security.tls.cert_file: ", o.cert_file,
                                                   " does not verify against ", o.ca_file, ": ",
                                                   X509_verify_cert_error_string(error)));
  }
  const std::vector<std::string> uris = UriSans(cert.get());
  std::optional<Role> role = Transport::RoleFromUris(uris, o.role_uri_prefix);
  if (!role.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("security.tls.cert_file: ", o.cert_file, " names no role: it needs a URI SAN ",
                     o.role_uri_prefix, "<router|prefill|decode|cache_store>",
                     uris.empty() ? std::string(" (it has no URI SAN)")
                                  : absl::StrCat(" (it has ", absl::StrJoin(uris, ", "), ")")));
  }
  return *role;
}

}  // namespace

// The cluster CA as servers verify client chains against it: the file is read again when its
// content changes (looked at once per reload period at most), as gRPC's file watcher does.
class CaBundle {
 public:
  CaBundle(std::string path, int reload_seconds)
      : path_(std::move(path)), period_(absl::Seconds(std::max(1, reload_seconds))) {}

  // The store of the file's certificates as last read; null when it never held one.
  std::shared_ptr<X509_STORE> Current() {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now - checked_ < period_) return store_;
    checked_ = now;
    absl::StatusOr<std::string> pem = ReadFileToString(path_);
    if (!pem.ok() || *pem == pem_) return store_;  // unreadable mid-swap: keep the last one
    StorePtr store = StoreFromPem(*pem);
    if (store == nullptr) return store_;
    pem_ = *std::move(pem);
    store_ = std::shared_ptr<X509_STORE>(store.release(), X509_STORE_free);
    return store_;
  }

 private:
  const std::string path_;
  const absl::Duration period_;
  absl::Mutex mu_;
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::string pem_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<X509_STORE> store_ ABSL_GUARDED_BY(mu_);
};

namespace {

// A channel's check of the server it reached, after gRPC has verified the chain: the server's
// certificate must name one of the roles the channel is for.
class RoleVerifier final : public grpc::experimental::ExternalCertificateVerifier {
 public:
  RoleVerifier(Roles expected, std::string prefix)
      : expected_(expected), prefix_(std::move(prefix)) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)> /*callback*/, grpc::Status* status) override {
    std::vector<std::string> uris;
    for (const grpc::string_ref& u : request->uri_names()) uris.emplace_back(u.data(), u.size());
    const std::optional<Role> role = Transport::RoleFromUris(uris, prefix_);
    if (role.has_value() && expected_.Has(*role)) {
      *status = grpc::Status::OK;
    } else {
      *status = grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          absl::StrCat("the server's certificate names ",
                       role.has_value() ? absl::StrCat("role ", RoleName(*role)) : "no role",
                       "; expected ", expected_.ToString()));
    }
    return true;  // decided synchronously
  }
  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {}

 private:
  const Roles expected_;
  const std::string prefix_;
};

// A server's check of the client certificate in its handshake (gRPC's own is off): the chain
// must lead to the CA now. Each refusal is counted and logged with the certificate's identity.
class ClientVerifier final : public grpc::experimental::ExternalCertificateVerifier {
 public:
  ClientVerifier(std::shared_ptr<CaBundle> ca, bool require, metrics::Metrics* metrics)
      : ca_(std::move(ca)), require_(require), metrics_(metrics) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)> /*callback*/, grpc::Status* status) override {
    const grpc::string_ref leaf_pem = request->peer_cert();
    if (leaf_pem.empty()) {
      *status = require_ ? Refuse("no_certificate", "no certificate", "this port requires one")
                         : grpc::Status::OK;  // the per-call role check refuses what it must
      return true;
    }
    X509Ptr leaf(PEM_read_bio_X509(MemoryBio(std::string(leaf_pem.data(), leaf_pem.size())).get(),
                                   nullptr, nullptr, nullptr));
    if (leaf == nullptr) {
      *status = Refuse("untrusted", "an unreadable certificate", "it does not parse");
      return true;
    }
    const std::shared_ptr<X509_STORE> store = ca_->Current();
    const grpc::string_ref chain = request->peer_cert_full_chain();
    const int error = store == nullptr
                          ? X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY
                          : VerifyChain(store.get(), leaf.get(),
                                        std::string(chain.data(), chain.size()));
    if (error == X509_V_OK) {
      *status = grpc::Status::OK;
      return true;
    }
    const bool expired =
        error == X509_V_ERR_CERT_HAS_EXPIRED || error == X509_V_ERR_CERT_NOT_YET_VALID;
    *status = Refuse(expired ? "expired" : "untrusted", Identity(leaf.get()),
                     X509_verify_cert_error_string(error));
    return true;  // decided synchronously
  }
  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {}

 private:
  // The certificate's URI SANs, else its subject.
  static std::string Identity(X509* cert) {
    const std::vector<std::string> uris = UriSans(cert);
    if (!uris.empty()) return absl::StrJoin(uris, ",");
    char subject[256] = {};
    X509_NAME_oneline(X509_get_subject_name(cert), subject, sizeof(subject) - 1);
    return subject;
  }

  grpc::Status Refuse(const char* reason, const std::string& who, const std::string& why) const {
    if (metrics_ != nullptr) metrics_->AuthDenied("tls_handshake", reason)->Increment();
    Log(LogLevel::kWarning, "security",
        absl::StrCat("TLS handshake refused (", reason, "): ", who, ": ", why));
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat("client certificate refused: ", why));
  }

  const std::shared_ptr<CaBundle> ca_;
  const bool require_;
  metrics::Metrics* const metrics_;
};

std::vector<std::string> Values(const grpc::AuthContext& auth, const char* property) {
  std::vector<std::string> out;
  for (const grpc::string_ref& v : auth.FindPropertyValues(property)) {
    out.emplace_back(v.data(), v.size());
  }
  return out;
}

}  // namespace

std::string Roles::ToString() const {
  std::vector<std::string> names;
  for (Role r : kAllRoles) {
    if (Has(r)) names.push_back(RoleName(r));
  }
  return names.empty() ? "no role" : absl::StrJoin(names, "|");
}

const char* RoleName(Role role) {
  switch (role) {
    case Role::kRouter:
      return "router";
    case Role::kPrefill:
      return "prefill";
    case Role::kDecode:
      return "decode";
    case Role::kCacheStore:
      return "cache_store";
  }
  return "?";
}

std::optional<Role> ParseRole(std::string_view name) {
  for (Role r : kAllRoles) {
    if (name == RoleName(r)) return r;
  }
  return std::nullopt;
}

std::shared_ptr<const Transport> Transport::Insecure() {
  static const std::shared_ptr<const Transport> insecure(new Transport());
  return insecure;
}

absl::StatusOr<std::shared_ptr<const Transport>> Transport::Create(
    const TransportOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(Role role, CheckFiles(options));
  std::shared_ptr<Transport> t(new Transport());
  t->tls_ = true;
  t->options_ = options;
  t->own_role_ = role;
  t->provider_ = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.key_file, options.cert_file, options.ca_file,
      static_cast<unsigned>(std::max(1, options.reload_seconds)));
  t->ca_ = std::make_shared<CaBundle>(options.ca_file, options.reload_seconds);
  return std::shared_ptr<const Transport>(std::move(t));
}

std::shared_ptr<grpc::ServerCredentials> Transport::ServerCredentials(
    ClientCertificates clients) const {
  if (!tls_) return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions o(provider_);
  o.watch_root_certs();
  o.watch_identity_key_cert_pairs();
  // gRPC asks for the certificate; ClientVerifier checks it (or its absence, on a port that
  // requires one) and counts what it refuses.
  o.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_BUT_DONT_VERIFY);
  o.set_certificate_verifier(grpc::experimental::ExternalCertificateVerifier::Create<ClientVerifier>(
      ca_, clients == ClientCertificates::kRequire, options_.metrics));
  return grpc::experimental::TlsServerCredentials(o);
}

std::shared_ptr<grpc::ChannelCredentials> Transport::ChannelCredentials(Roles servers) const {
  if (!tls_) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions o;
  o.set_certificate_provider(provider_);
  o.watch_root_certs();
  o.watch_identity_key_cert_pairs();
  o.set_verify_server_certs(true);  // the chain, against the CA
  o.set_check_call_host(false);     // servers are known by role, not host name
  o.set_certificate_verifier(grpc::experimental::ExternalCertificateVerifier::Create<RoleVerifier>(
      servers, options_.role_uri_prefix));
  return grpc::experimental::TlsCredentials(o);
}

std::optional<Role> Transport::RoleFromUris(const std::vector<std::string>& uris,
                                            std::string_view prefix) {
  for (const std::string& uri : uris) {
    if (uri.size() <= prefix.size() || uri.compare(0, prefix.size(), prefix) != 0) continue;
    if (auto role = ParseRole(std::string_view(uri).substr(prefix.size()))) return role;
  }
  return std::nullopt;
}

std::optional<Role> Transport::PeerRole(const grpc::AuthContext& auth) const {
  if (!tls_ || !auth.IsPeerAuthenticated()) return std::nullopt;
  return RoleFromUris(Values(auth, GRPC_PEER_URI_PROPERTY_NAME), options_.role_uri_prefix);
}

std::string Transport::PeerName(const grpc::AuthContext& auth, const std::string& peer_address) {
  if (auth.IsPeerAuthenticated()) {
    std::vector<std::string> names = Values(auth, GRPC_PEER_URI_PROPERTY_NAME);
    if (names.empty()) names = Values(auth, GRPC_X509_SAN_PROPERTY_NAME);
    if (names.empty()) names = Values(auth, GRPC_X509_CN_PROPERTY_NAME);
    if (!names.empty()) return absl::StrCat(absl::StrJoin(names, ","), " at ", peer_address);
  }
  return absl::StrCat("no certificate, at ", peer_address);
}

bool IsLoopbackListen(std::string_view listen) {
  const size_t colon = listen.rfind(':');
  std::string host(listen.substr(0, colon == std::string_view::npos ? listen.size() : colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

absl::Status CheckListener(const std::string& key, const std::string& listen, bool tls,
                           bool allow_insecure) {
  if (tls || listen.empty() || IsLoopbackListen(listen)) return absl::OkStatus();
  if (allow_insecure) {
    Log(LogLevel::kWarning, "security",
        absl::StrCat(key, " ", listen,
                     " is beyond loopback without TLS "
                     "(security.allow_insecure): anyone who reaches it is trusted"));
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      key, " ", listen,
      " is beyond loopback without TLS, so anyone who reaches it would be "
      "trusted. Configure security.tls (ca_file, cert_file, key_file; scripts/dev-certs.sh makes "
      "a test CA), listen on 127.0.0.1, or, on a trusted lab network only, set "
      "security.allow_insecure: true"));
}

}  // namespace tandem::security
