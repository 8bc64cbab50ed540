// A deliberately raw HTTP/1.1 client over a loopback socket, for the HTTP server's tests: it
// sends exactly the bytes a test gives it (malformed, partial, pipelined) and reads with a
// deadline, so a test can also be the client that stalls or never reads.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

namespace tandem::testing {

class RawHttpClient {
 public:
  explicit RawHttpClient(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawHttpClient() { Close(); }
  RawHttpClient(const RawHttpClient&) = delete;
  RawHttpClient& operator=(const RawHttpClient&) = delete;

  bool connected() const { return connected_; }

  bool Send(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads until `done(received)` holds, the peer closes, or `timeout` passes. Returns what has
  // been received (all of it, across calls).
  template <typename Done>
  const std::string& ReadUntil(Done done, std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (!done(received_) && !closed_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[65536];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      received_.append(buf, static_cast<size_t>(n));
    }
    return received_;
  }
  // Reads until `text` has arrived.
  const std::string& ReadUntilContains(const std::string& text,
                                       std::chrono::milliseconds timeout) {
    return ReadUntil([&](const std::string& r) { return r.find(text) != std::string::npos; },
                     timeout);
  }
  // Reads until the server closes the connection.
  const std::string& ReadToClose(std::chrono::milliseconds timeout) {
    return ReadUntil([](const std::string&) { return false; }, timeout);
  }
  bool peer_closed() const { return closed_; }
  const std::string& received() const { return received_; }
  void Clear() { received_.clear(); }

  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  // Shrinks the receive buffer, so a client that never reads fills the server's socket fast.
  void SetReceiveBuffer(int bytes) { setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes)); }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_ = false;
  std::string received_;
};

// The body of a chunked HTTP response (everything after the head), decoded; `complete` says
// whether the last chunk arrived.
inline std::string DecodeChunked(const std::string& response, bool* complete) {
  *complete = false;
  size_t pos = response.find("\r\n\r\n");
  if (pos == std::string::npos) return "";
  pos += 4;
  std::string body;
  while (true) {
    const size_t eol = response.find("\r\n", pos);
    if (eol == std::string::npos) return body;
    const size_t size = std::strtoul(response.substr(pos, eol - pos).c_str(), nullptr, 16);
    if (size == 0) {
      *complete = response.compare(eol, 4, "\r\n\r\n") == 0;
      return body;
    }
    if (eol + 2 + size + 2 > response.size()) return body;
    body += response.substr(eol + 2, size);
    pos = eol + 2 + size + 2;
  }
}

}  // namespace tandem::testing
