// The HTTP ceiling of scripts/bench: a Beast server that answers every request with 200
// and a fixed body of the given size, with the same threading as kstate's server
// (asynchronous sessions, N threads running one io_context) and keep-alive. No routing,
// no store, no JSON: what Beast and the kernel cost per request on this machine.
//
//   trivial_server PORT BODY_BYTES THREADS
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

static std::string g_body;

class session : public std::enable_shared_from_this<session> {
 public:
  explicit session(tcp::socket s) : stream_(std::move(s)) {}
  void start() { read(); }

 private:
  void read() {
    req_ = {};
    http::async_read(stream_, buf_, req_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->close();
      self->write();
    });
  }
  void write() {
    res_ = {};
    res_.result(http::status::ok);
    res_.version(req_.version());
    res_.set(http::field::content_type, "application/json");
    res_.keep_alive(req_.keep_alive());
    res_.body() = g_body;
    res_.prepare_payload();
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec || !self->res_.keep_alive()) return self->close();
      self->read();
    });
  }
  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);  // best effort; ignored
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buf_;
  http::request<http::string_body> req_;
  http::response<http::string_body> res_;
};

static void accept(tcp::acceptor& a, asio::io_context& io) {
  a.async_accept(asio::make_strand(io), [&a, &io](beast::error_code ec, tcp::socket s) {
    if (!ec) {
      s.set_option(tcp::no_delay(true));
      std::make_shared<session>(std::move(s))->start();
    }
    accept(a, io);
  });
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: trivial_server PORT BODY_BYTES THREADS\n");
    return 2;
  }
  g_body.assign(std::atoi(argv[2]), 'x');
  int threads = std::atoi(argv[3]);
  asio::io_context io(threads);
  tcp::acceptor acc(io, {asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(std::atoi(argv[1]))});
  accept(acc, io);
  asio::signal_set sigs(io, SIGINT, SIGTERM);
  sigs.async_wait([&](beast::error_code, int) { io.stop(); });
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back([&] { io.run(); });
  io.run();
  for (auto& t : pool) t.join();
}
