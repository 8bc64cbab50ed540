// Mutual TLS between roles with certificates openssl makes at test time (scripts/dev-certs.sh):
// a cache-store service on a real loopback gRPC server, called by each role and by clients with
// no certificate, another CA's, an expired one or another role's.
#include "common/security/transport.h"

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "cache_store/cache_store_service.h"
#include "common/security/authorizer.h"
#include "common/store/cache_store_client.h"
#include "tandem/v1/cache_store.pb.h"
#include "tandem/v1/workers.pb.h"
#include "tests/unit/testing/eventually.h"

namespace tandem::security {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// Runs scripts/dev-certs.sh with `args`.
void DevCerts(const std::string& args) {
  const std::string command =
      absl::StrCat(TANDEM_SOURCE_DIR, "/scripts/dev-certs.sh ", args, " > /dev/null");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class TransportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(
        (fs::temp_directory_path() / absl::StrCat("tandem_certs_", getpid())).string());
    DevCerts(*dir_ + "/a");
    DevCerts(*dir_ + "/other");  // another CA with the same role names
    DevCerts(*dir_ + "/a --cert expired --uri spiffe://tandem/prefill --expired");
    DevCerts(*dir_ + "/a --cert norole");
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }

  static std::string File(const std::string& name) { return *dir_ + "/" + name; }
  static TransportOptions For(const std::string& role, const std::string& ca = "a") {
    return {.ca_file = File(ca + "/ca.pem"),
            .cert_file = File(ca + "/" + role + ".pem"),
            .key_file = File(ca + "/" + role + ".key"),
            .reload_seconds = 1};
  }
  static std::shared_ptr<const Transport> Make(const std::string& role) {
    auto t = Transport::Create(For(role));
    EXPECT_TRUE(t.ok()) << t.status();
    return *t;
  }

  // A cache-store shard served over `transport`, its refusals counted in metrics_.
  void StartStore(std::shared_ptr<const Transport> transport) {
    store_ = cache_store::BlockStore::Create({.capacity_bytes = 1 << 20, .shared_memory = false})
                 .value();
    authorizer_ = std::make_unique<Authorizer>(transport, &metrics_);
    service_ = std::make_unique<cache_store::CacheStoreService>(
        *store_, 1 << 16, cache_store::ShmHandoffOptions{}, *authorizer_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0",
                             transport->ServerCredentials(ClientCertificates::kRequire), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  std::unique_ptr<store::CacheStoreClient> Client(
      std::shared_ptr<grpc::ChannelCredentials> credentials) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    return std::make_unique<store::CacheStoreClient>(
        grpc::CreateCustomChannel(address_, credentials, args), "model",
        store::CacheStoreClientOptions{.timeout = std::chrono::seconds(10)});
  }
  // A plain gRPC TLS client (verifies the server by host name, as public clients do).
  static std::shared_ptr<grpc::ChannelCredentials> SslClient(const std::string& ca,
                                                             const std::string& cert) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = Read(File(ca));
    if (!cert.empty()) {
      o.pem_cert_chain = Read(File(cert + ".pem"));
      o.pem_private_key = Read(File(cert + ".key"));
    }
    return grpc::SslCredentials(o);
  }
  double Denied(const std::string& method, const std::string& reason) {
    return metrics_.AuthDenied(method, reason)->Value();
  }

  static std::string* dir_;
  metrics::Metrics metrics_;
  std::unique_ptr<cache_store::BlockStore> store_;
  std::unique_ptr<Authorizer> authorizer_;
  std::unique_ptr<cache_store::CacheStoreService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};
std::string* TransportTest::dir_ = nullptr;

std::vector<store::BlockData> OneBlock() {
  return {store::BlockData{.hash = 42, .bytes = std::string(1000, 'x')}};
}

TEST_F(TransportTest, CreateRefusesBadFilesAtStartup) {
  TransportOptions o = For("router");
  o.key_file = File("a/prefill.key");
  EXPECT_THAT(Transport::Create(o).status().message(), HasSubstr("is not the key of"));
  EXPECT_THAT(Transport::Create(For("norole")).status().message(), HasSubstr("names no role"));
  EXPECT_THAT(Transport::Create(For("expired")).status().message(), HasSubstr("expired"));
  o = For("prefill", "other");
  o.ca_file = File("a/ca.pem");
  EXPECT_THAT(Transport::Create(o).status().message(), HasSubstr("does not verify against"));
  o = For("prefill");
  o.cert_file = File("a/missing.pem");
  EXPECT_THAT(Transport::Create(o).status().message(), HasSubstr("security.tls.cert_file"));
  auto t = Transport::Create(For("cache_store"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->own_role(), Role::kCacheStore);
}

TEST_F(TransportTest, EachRoleGetsWhatItsRoleMayCall) {
  StartStore(Make("cache_store"));
  auto prefill = Client(Make("prefill")->ChannelCredentials(Role::kCacheStore));
  ASSERT_TRUE(prefill->Put(OneBlock()).ok());
  auto decode = Client(Make("decode")->ChannelCredentials(Role::kCacheStore));
  auto got = decode->Get(std::vector<uint64_t>{42});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), 1u);

  // A decode worker may read blocks but never write them (a poisoned cache).
  auto put = decode->Put(OneBlock());
  EXPECT_EQ(put.status().code(), absl::StatusCode::kPermissionDenied) << put.status();
  EXPECT_EQ(Denied("/tandem.v1.CacheStore/Put", "role"), 1);
  // The router reads no blocks.
  auto router = Client(Make("router")->ChannelCredentials(Role::kCacheStore));
  EXPECT_EQ(router->Get(std::vector<uint64_t>{42}).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Denied("/tandem.v1.CacheStore/Get", "role"), 1);
  EXPECT_TRUE(router->Stats().ok());  // stats are for every role
}

TEST_F(TransportTest, PeersWithoutAGoodCertificateNeverGetIn) {
  TransportOptions options = For("cache_store");
  options.metrics = &metrics_;  // the handshakes it refuses are counted
  StartStore(Transport::Create(options).value());
  const auto refused = [&](std::shared_ptr<grpc::ChannelCredentials> c) {
    return Client(std::move(c))->Exists(std::vector<uint64_t>{1}).status();
  };
  // Without one, from another CA, expired: the handshake fails.
  EXPECT_EQ(refused(SslClient("a/ca.pem", "")).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(refused(SslClient("a/ca.pem", "other/prefill")).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(refused(SslClient("a/ca.pem", "a/expired")).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(refused(grpc::InsecureChannelCredentials()).code(), absl::StatusCode::kUnavailable);
  // Each refused handshake by its reason (plaintext never reaches one; a client may try its
  // handshake again before it gives up).
  EXPECT_GE(Denied("tls_handshake", "no_certificate"), 1);
  EXPECT_GE(Denied("tls_handshake", "untrusted"), 1);
  EXPECT_GE(Denied("tls_handshake", "expired"), 1);
  // A good client certificate with no role gets through the handshake, then no method.
  EXPECT_EQ(refused(SslClient("a/ca.pem", "a/norole")).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Denied("/tandem.v1.CacheStore/Exists", "no_certificate"), 1);
  // The store itself keeps serving.
  EXPECT_TRUE(Client(Make("prefill")->ChannelCredentials(Role::kCacheStore))
                  ->Exists(std::vector<uint64_t>{1})
                  .ok());
}

TEST_F(TransportTest, ChannelsAcceptOnlyTheRoleTheyAreFor) {
  StartStore(Make("router"));  // a router's certificate where a store should be
  auto s = Client(Make("prefill")->ChannelCredentials(Role::kCacheStore))
               ->Exists(std::vector<uint64_t>{1})
               .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  server_->Shutdown();
  server_.reset();
  StartStore(Make("cache_store"));
  EXPECT_TRUE(Client(Make("prefill")->ChannelCredentials(Role::kCacheStore))
                  ->Exists(std::vector<uint64_t>{1})
                  .ok());
}

// The files are re-read while serving: a server moved to a new CA's certificate is trusted by a
// client of that CA without a restart, and the old CA's clients are not.
TEST_F(TransportTest, RotatedFilesTakeEffectWithoutARestart) {
  const std::string live = File("live");
  fs::create_directories(live);
  const auto install = [&](const std::string& from) {
    for (const char* f : {"ca.pem", "cache_store.pem", "cache_store.key"}) {
      fs::copy_file(File(from + "/" + f), live + "/" + f + ".new",
                    fs::copy_options::overwrite_existing);
      fs::rename(live + "/" + f + ".new", live + "/" + f);
    }
  };
  install("a");
  auto server_transport = Transport::Create({.ca_file = live + "/ca.pem",
                                             .cert_file = live + "/cache_store.pem",
                                             .key_file = live + "/cache_store.key",
                                             .reload_seconds = 1});
  ASSERT_TRUE(server_transport.ok()) << server_transport.status();
  StartStore(*server_transport);
  auto old_client = Make("prefill");
  auto new_client = Transport::Create(For("prefill", "other"));
  ASSERT_TRUE(new_client.ok());
  const auto works = [&](const std::shared_ptr<const Transport>& t) {
    return Client(t->ChannelCredentials(Role::kCacheStore))->Exists(std::vector<uint64_t>{1}).ok();
  };
  EXPECT_TRUE(works(old_client));
  EXPECT_FALSE(works(*new_client));
  install("other");
  EXPECT_TRUE(testing::Eventually([&] { return works(*new_client); }));
  EXPECT_FALSE(works(old_client));
}

// Every method of every internal service has a rule; the public API has none (API keys guard
// it). A method added without a rule fails here before it is refused to everyone in a cluster.
TEST(AuthorizerTest, EveryInternalMethodHasARule) {
  const google::protobuf::DescriptorPool* pool = google::protobuf::DescriptorPool::generated_pool();
  // Loads the files that declare the services.
  ASSERT_NE(tandem::v1::PrefillRequest::descriptor(), nullptr);
  ASSERT_NE(tandem::v1::GetRequest::descriptor(), nullptr);
  int methods = 0;
  for (const char* name : {"tandem.v1.CacheStore", "tandem.v1.PrefillWorker",
                           "tandem.v1.DecodeWorker", "tandem.v1.Registry"}) {
    const google::protobuf::ServiceDescriptor* service = pool->FindServiceByName(name);
    ASSERT_NE(service, nullptr) << name;
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string method = absl::StrCat("/", name, "/", service->method(i)->name());
      EXPECT_FALSE(Authorizer::AllowedRoles(method).empty()) << method << " has no rule";
      ++methods;
    }
  }
  EXPECT_EQ(methods, 14);
  EXPECT_TRUE(Authorizer::AllowedRoles("/tandem.v1.Inference/Generate").empty());
  EXPECT_TRUE(Authorizer::AllowedRoles("/tandem.v1.CacheStore/Put").Has(Role::kPrefill));
  EXPECT_FALSE(Authorizer::AllowedRoles("/tandem.v1.CacheStore/Put").Has(Role::kDecode));
  EXPECT_FALSE(Authorizer::AllowedRoles("/tandem.v1.Registry/Register").Has(Role::kCacheStore));
}

TEST(ListenerTest, BeyondLoopbackNeedsTlsOrAnExplicitOptOut) {
  for (const char* a : {"127.0.0.1:80", "127.9.9.9:0", "localhost:1", "[::1]:8000"}) {
    EXPECT_TRUE(IsLoopbackListen(a)) << a;
    EXPECT_TRUE(CheckListener("router.listen", a, false, false).ok()) << a;
  }
  for (const char* a : {"0.0.0.0:8000", "[::]:1", ":8000", "10.0.0.5:7000", "example.com:1"}) {
    EXPECT_FALSE(IsLoopbackListen(a)) << a;
    const absl::Status s = CheckListener("prefill.listen", a, false, false);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << a;
    EXPECT_THAT(s.message(), HasSubstr("security.allow_insecure"));
    EXPECT_TRUE(CheckListener("prefill.listen", a, true, false).ok()) << a;
    EXPECT_TRUE(CheckListener("prefill.listen", a, false, true).ok()) << a;
  }
  EXPECT_TRUE(CheckListener("router.http_listen", "", false, false).ok());  // off
}

}  // namespace
}  // namespace tandem::security
