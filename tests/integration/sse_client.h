#pragma once
// A minimal Server-Sent Events client for the change subscription tests: one GET on
// its own socket, the chunked body cut into events as it comes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "support.h"

namespace kstate::testing {

struct event {
  std::string type, id;
  json data;
};

// A minimal streaming client: one GET, the chunked body read as it comes and cut into
// SSE events (blank-line separated "field: value" lines).
class sse_stream {
 public:
  sse_stream(uint16_t port, const std::string& target, const std::string& last_event_id) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd_);
      fd_ = -1;
      return;
    }
    std::string req = "GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n";
    if (!last_event_id.empty()) req += "Last-Event-ID: " + last_event_id + "\r\n";
    req += "\r\n";
    if (::send(fd_, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) close();
  }
  ~sse_stream() { close(); }
  bool open() const { return fd_ >= 0; }
  int status() const { return status_; }
  const std::string& error_body() const { return body_; }

  // The next event, waiting at most about a second; nullopt when none came (still open)
  // or the stream ended (open() false then).
  std::optional<event> next() {
    for (;;) {
      if (auto e = take_event()) return e;
      if (!fill()) return std::nullopt;
    }
  }

 private:
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Reads more bytes; false on timeout or end.
  bool fill() {
    if (fd_ < 0) return false;
    char buf[65536];
    auto n = ::recv(fd_, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
      close();
      return false;
    }
    if (n < 0) return false;
    raw_.append(buf, static_cast<size_t>(n));
    decode();
    return true;
  }
  // Headers, then chunks into text_.
  void decode() {
    if (status_ == 0) {
      auto end = raw_.find("\r\n\r\n");
      if (end == std::string::npos) return;
      status_ = std::stoi(raw_.substr(9, 3));
      chunked_ = raw_.substr(0, end).find("chunked") != std::string::npos;
      raw_.erase(0, end + 4);
    }
    if (!chunked_) {
      body_ += raw_;
      raw_.clear();
      return;
    }
    for (;;) {
      auto eol = raw_.find("\r\n");
      if (eol == std::string::npos) return;
      const size_t size = std::stoul(raw_.substr(0, eol), nullptr, 16);
      if (raw_.size() < eol + 2 + size + 2) return;
      (status_ == 200 ? text_ : body_) += raw_.substr(eol + 2, size);
      raw_.erase(0, eol + 2 + size + 2);
      if (size == 0) {
        close();
        return;
      }
    }
  }
  std::optional<event> take_event() {
    auto end = text_.find("\n\n");
    if (end == std::string::npos) return std::nullopt;
    event e;
    std::string block = text_.substr(0, end);
    text_.erase(0, end + 2);
    size_t at = 0;
    while (at <= block.size()) {
      auto eol = block.find('\n', at);
      auto line = block.substr(at, eol == std::string::npos ? std::string::npos : eol - at);
      if (line.rfind("event: ", 0) == 0) e.type = line.substr(7);
      else if (line.rfind("id: ", 0) == 0) e.id = line.substr(4);
      else if (line.rfind("data: ", 0) == 0) e.data = json::parse(line.substr(6));
      if (eol == std::string::npos) break;
      at = eol + 1;
    }
    return e;
  }

  int fd_ = -1;
  int status_ = 0;
  bool chunked_ = false;
  std::string raw_, text_, body_;
};

// Reads events until `done` says the subscriber has seen enough (or the deadline).
template <typename Done>
std::vector<event> read_until(sse_stream& s, Done done, std::chrono::seconds timeout) {
  std::vector<event> out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline && s.open()) {
    if (auto e = s.next()) {
      out.push_back(std::move(*e));
      if (done(out)) break;
    }
  }
  return out;
}

}  // namespace kstate::testing
