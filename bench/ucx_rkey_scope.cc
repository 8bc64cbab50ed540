// What a UCX remote key protects (issue #26, "Security"): a target process registers one
// region and hands out its packed remote key; an initiator process with that key then reads
// (1) inside the region, (2) a buffer of the target's that was never registered, and (3) the
// region after the target unregistered it. On RDMA NICs the hardware checks every access
// against the registration; this probe shows what the transports UCX_TLS selects do.
//
// Measured with Debian's UCX 1.13.1 on tcp, sm (posix, sysv, cma) over loopback
// (docs/benchmarks.md, "UCX remote keys without RDMA"): all three reads succeed. Without an RDMA
// NIC, UCX emulates get and put in software and the target reads whatever address a peer
// names, so a remote key there is no capability: the UCX data plane has to check each transfer
// itself rather than rely on one-sided access.
//
//   UCX_TLS=tcp build/bench/ucx-rkey-scope
#include <poll.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void Check(ucs_status_t s, const char* what) {
  if (s == UCS_OK) return;
  std::fprintf(stderr, "ucx-rkey-scope: %s: %s\n", what, ucs_status_string(s));
  std::exit(2);
}

struct Endpoint {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
};

Endpoint Create() {
  Endpoint e;
  ucp_config_t* config = nullptr;
  Check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA;
  Check(ucp_init(&params, config, &e.context), "ucp_init");
  ucp_config_release(config);
  ucp_worker_params_t worker{};
  worker.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker.thread_mode = UCS_THREAD_MODE_SINGLE;
  Check(ucp_worker_create(e.context, &worker, &e.worker), "ucp_worker_create");
  return e;
}

// Progresses `worker` until the request completes, or 10 s pass.
ucs_status_t Wait(ucp_worker_h worker, ucs_status_ptr_t request) {
  if (request == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
  ucs_status_t s = UCS_INPROGRESS;
  for (int64_t spins = 0; (s = ucp_request_check_status(request)) == UCS_INPROGRESS; ++spins) {
    ucp_worker_progress(worker);
    if ((spins & 0xffff) == 0 && spins > (int64_t{1} << 30)) break;
  }
  ucp_request_free(request);
  return s;
}

void WriteAll(int fd, const void* data, size_t n) {
  if (write(fd, data, n) != static_cast<ssize_t>(n)) std::exit(2);
}
void ReadAll(int fd, void* data, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = read(fd, static_cast<char*>(data) + got, n - got);
    if (r <= 0) std::exit(2);
    got += static_cast<size_t>(r);
  }
}

// The target: registers `shared`, sends its worker address, the key and the addresses of the
// region and of an unregistered buffer, then serves (progresses) until told to unregister
// ('u') or to quit ('q').
[[noreturn]] void Target(int to_initiator, int from_initiator) {
  Endpoint e = Create();
  std::vector<char> shared(1 << 20, 'K'), secret(1 << 20, 'S');
  ucp_address_t* address = nullptr;
  size_t address_len = 0;
  Check(ucp_worker_get_address(e.worker, &address, &address_len), "ucp_worker_get_address");
  ucp_mem_map_params_t map{};
  map.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  map.address = shared.data();
  map.length = shared.size();
  ucp_mem_h memh = nullptr;
  Check(ucp_mem_map(e.context, &map, &memh), "ucp_mem_map");
  void* rkey = nullptr;
  size_t rkey_len = 0;
  Check(ucp_rkey_pack(e.context, memh, &rkey, &rkey_len), "ucp_rkey_pack");
  const uint64_t header[4] = {address_len, rkey_len, reinterpret_cast<uint64_t>(shared.data()),
                              reinterpret_cast<uint64_t>(secret.data())};
  WriteAll(to_initiator, header, sizeof header);
  WriteAll(to_initiator, address, address_len);
  WriteAll(to_initiator, rkey, rkey_len);
  while (true) {
    ucp_worker_progress(e.worker);
    pollfd p{.fd = from_initiator, .events = POLLIN, .revents = 0};
    if (poll(&p, 1, 0) <= 0) continue;
    char command = 'q';
    if (read(from_initiator, &command, 1) != 1 || command == 'q') break;
    if (command == 'u') {
      Check(ucp_mem_unmap(e.context, memh), "ucp_mem_unmap");
      WriteAll(to_initiator, "d", 1);
    }
  }
  std::_Exit(0);
}

}  // namespace

int main() {
  int to_initiator[2], to_target[2];
  if (pipe(to_initiator) != 0 || pipe(to_target) != 0) return 2;
  const pid_t target = fork();
  if (target == 0) Target(to_initiator[1], to_target[0]);

  Endpoint e = Create();
  uint64_t header[4];
  ReadAll(to_initiator[0], header, sizeof header);
  std::vector<char> address(header[0]), rkey(header[1]);
  ReadAll(to_initiator[0], address.data(), address.size());
  ReadAll(to_initiator[0], rkey.data(), rkey.size());
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  ucp_ep_h ep = nullptr;
  Check(ucp_ep_create(e.worker, &params, &ep), "ucp_ep_create");
  ucp_rkey_h key = nullptr;
  Check(ucp_ep_rkey_unpack(ep, rkey.data(), &key), "ucp_ep_rkey_unpack");

  // One read of 16 bytes at `remote`: what came back, or the error.
  auto read_at = [&](uint64_t remote) {
    char buf[17] = {};
    ucp_request_param_t request{};
    const ucs_status_t s = Wait(e.worker, ucp_get_nbx(ep, buf, 16, remote, key, &request));
    return s == UCS_OK ? "read \"" + std::string(buf, 8) + "...\""
                       : std::string("refused: ") + ucs_status_string(s);
  };
  std::printf("inside the registered region: %s\n", read_at(header[2]).c_str());
  std::printf("a buffer never registered: %s\n", read_at(header[3]).c_str());
  WriteAll(to_target[1], "u", 1);
  char done = 0;
  ReadAll(to_initiator[0], &done, 1);
  std::printf("the region after it was unregistered: %s\n", read_at(header[2]).c_str());
  WriteAll(to_target[1], "q", 1);
  waitpid(target, nullptr, 0);
  return 0;
}
