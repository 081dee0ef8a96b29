// Transport benchmark, one run over loopback: throughput of 4 MiB tensor messages over the TLS 1.3
// channel and over plain TCP with the same framing and checks, round-trip time of 1 KiB messages
// (p50, p99), and the same over gRPC with mutual TLS when it was found at build time.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <asio/write.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "bench_grpc.h"
#include "cleave/protocol/protocol.h"
#include "cleave/transport/certs.h"
#include "cleave/transport/connect.h"
#include "cleave/transport/listener.h"
#include "cleave/transport/log.h"

using namespace cleave;
using namespace cleave::transport;
using clock_type = std::chrono::steady_clock;

namespace {

struct bench_options {
  int n_messages = 64;
  std::size_t message_bytes = 4u << 20;
  int n_round_trips = 2000;
  std::size_t small_bytes = 1024;
  int n_rounds = 3;  // throughput rounds, each TCP then TLS (then gRPC), medians reported
  std::string only;  // "tls", "tcp" or "grpc": run one part (for profiling)
};

class io_thread {
 public:
  io_thread() : work_(io_.get_executor()), thread_([this] { io_.run(); }) {}
  ~io_thread() {
    work_.reset();
    io_.stop();
    thread_.join();
  }
  asio::any_io_executor executor() { return io_.get_executor(); }
  template <class T>
  std::future<T> spawn(asio::awaitable<T> a) {
    return asio::co_spawn(io_, std::move(a), asio::use_future);
  }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_transport: %s\n", what.c_str());
  std::exit(1);
}

template <class T>
T must(result<T> r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().reason());
  return std::move(r.value());
}

void must(const status& s, const char* what) {
  if (!s) die(std::string(what) + ": " + s.error().reason());
}

// A big message: one f32 tensor of `bytes` bytes, copied once into the frame.
message_builder big_message(const std::vector<float>& data, std::uint64_t seq) {
  protocol::global_weights_desc info;
  info.round = seq;
  info.n_blocks = 1;
  return protocol::make_global_weights(info, data, {});
}

// A small message: a step's activation of one sample, data.size() / 4 f32 values.
message_builder small_message(const std::vector<std::uint8_t>& data, std::uint64_t seq) {
  protocol::step_key key;
  key.step = seq;
  key.block = 1;
  const tensor_source t{core::dtype::f32, {1, static_cast<std::int64_t>(data.size() / 4)}, data.data(), "activation"};
  return protocol::make_activations(key, {1, 1}, t);
}

// Receiver-side check that a big message is what was sent.
void check_big(const message& m, std::uint64_t seq, std::size_t n_floats) {
  const auto* gw = m.as<wire::GlobalWeights>();
  if (!gw || gw->round() != seq) die("unexpected message " + describe(m));
  const auto v = view_of(*gw->weights()->Get(0)).values<float>();
  if (v.size() != n_floats || v[0] != static_cast<float>(seq) || v[n_floats - 1] != static_cast<float>(n_floats - 1))
    die("payload corrupted");
}

std::vector<float> big_payload(std::size_t bytes) {
  std::vector<float> v(bytes / sizeof(float));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return v;
}

struct latency {
  double p50_us = 0;
  double p99_us = 0;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

latency percentiles(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  const auto at = [&](double q) { return us[std::min(us.size() - 1, static_cast<std::size_t>(q * us.size()))]; };
  return {at(0.50), at(0.99)};
}

// ---- TLS channel ----

double tls_throughput(io_thread& server_io, io_thread& client_io, listener& lis, const tls_context& client_ctx,
                      const bench_options& o, int warmup) {
  const std::size_t n_floats = o.message_bytes / sizeof(float);
  // Both ends of the measured interval are taken where the messages arrive: from the last
  // warm-up message to the last one, exactly n_messages arrive (queues play no part).
  clock_type::time_point t0;
  std::promise<clock_type::time_point> done;
  // A named closure: the coroutine refers to its captures until the future is ready.
  auto received_fn = [&]() -> asio::awaitable<void> {
    channel ch = must(co_await lis.accept(), "accept");
    for (int i = 0; i < warmup + o.n_messages; ++i) {
      message m = must(co_await ch.receive(), "receive");
      check_big(m, static_cast<std::uint64_t>(i), n_floats);
      if (i == warmup - 1) t0 = clock_type::now();
    }
    done.set_value(clock_type::now());
    co_await ch.close();
  };
  auto received = server_io.spawn(received_fn());
  // A named closure: the coroutine refers to its captures until the future is ready.
  auto sent_fn = [&]() -> asio::awaitable<void> {
    channel ch = must(co_await connect(client_ctx, "127.0.0.1", lis.port()), "connect");
    auto data = big_payload(o.message_bytes);
    for (int i = 0; i < warmup + o.n_messages; ++i) {
      data[0] = static_cast<float>(i);
      must(co_await ch.send(big_message(data, static_cast<std::uint64_t>(i))), "send");
    }
    co_await ch.close();
  };
  auto sent = client_io.spawn(sent_fn());
  const auto t1 = done.get_future().get();
  sent.get();
  received.get();
  return static_cast<double>(o.message_bytes) * o.n_messages / std::chrono::duration<double>(t1 - t0).count();
}

latency tls_round_trips(io_thread& server_io, io_thread& client_io, listener& lis, const tls_context& client_ctx,
                        const bench_options& o) {
  const int warmup = 200;
  const int n = warmup + o.n_round_trips;
  // A named closure: the coroutine refers to its captures until the future is ready.
  auto echo_fn = [&]() -> asio::awaitable<void> {
    channel ch = must(co_await lis.accept(), "accept");
    for (int i = 0; i < n; ++i) {
      message m = must(co_await ch.receive(), "receive");
      const auto* a = m.as<wire::Activations>();
      if (!a) die("unexpected message");
      const tensor_view v = view_of(*a->activation());
      protocol::step_key key;
      key.step = a->step();
      key.block = 1;
      const tensor_source t{v.dtype, v.shape, v.data.data(), "gradient"};
      must(co_await ch.send(protocol::make_gradients(key, t)), "send");
    }
    co_await ch.close();
  };
  auto echo = server_io.spawn(echo_fn());
  std::vector<double> us;
  // A named closure: the coroutine refers to its captures until the future is ready.
  auto client_fn = [&]() -> asio::awaitable<void> {
    connect_options co;
    co.channel.heartbeat = std::chrono::milliseconds(0);
    channel ch = must(co_await connect(client_ctx, "127.0.0.1", lis.port(), co), "connect");
    const std::vector<std::uint8_t> data(o.small_bytes, 7);
    for (int i = 0; i < n; ++i) {
      const auto t0 = clock_type::now();
      must(co_await ch.send(small_message(data, static_cast<std::uint64_t>(i))), "send");
      message m = must(co_await ch.receive(), "receive");
      const auto t1 = clock_type::now();
      if (!m.as<wire::Gradients>() || m.as<wire::Gradients>()->step() != static_cast<std::uint64_t>(i))
        die("unexpected reply");
      if (i >= warmup) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    co_await ch.close();
  };
  auto client = client_io.spawn(client_fn());
  client.get();
  echo.get();
  return percentiles(std::move(us));
}

// ---- The ceiling: blocking OpenSSL with the same contexts, raw payloads, no framing ----

double openssl_ceiling(const tls_context& server_ctx, const tls_context& client_ctx, const bench_options& o,
                       int warmup) {
  const int listen_fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd, 1) != 0 ||
      ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    die("ceiling: cannot listen");
  clock_type::time_point t0, t1;
  std::thread server([&] {
    const int fd = ::accept(listen_fd, nullptr, nullptr);
    SSL* ssl = SSL_new(server_ctx.native());
    SSL_set_fd(ssl, fd);
    if (SSL_accept(ssl) != 1) die("ceiling: handshake failed");
    std::vector<char> buf(o.message_bytes);
    for (int i = 0; i < warmup + o.n_messages; ++i) {
      for (std::size_t got = 0; got < buf.size();) {
        std::size_t k = 0;
        if (SSL_read_ex(ssl, buf.data() + got, buf.size() - got, &k) != 1) die("ceiling: read failed");
        got += k;
      }
      if (i == warmup - 1) t0 = clock_type::now();
    }
    t1 = clock_type::now();
    SSL_free(ssl);
    ::close(fd);
  });
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) die("ceiling: cannot connect");
  SSL* ssl = SSL_new(client_ctx.native());
  SSL_set_fd(ssl, fd);
  if (SSL_connect(ssl) != 1) die("ceiling: handshake failed");
  const auto data = big_payload(o.message_bytes);
  for (int i = 0; i < warmup + o.n_messages; ++i) {
    const char* p = reinterpret_cast<const char*>(data.data());
    for (std::size_t done = 0; done < o.message_bytes;) {
      std::size_t k = 0;
      if (SSL_write_ex(ssl, p + done, o.message_bytes - done, &k) != 1) die("ceiling: write failed");
      done += k;
    }
  }
  server.join();
  SSL_free(ssl);
  ::close(fd);
  ::close(listen_fd);
  return static_cast<double>(o.message_bytes) * o.n_messages / std::chrono::duration<double>(t1 - t0).count();
}

// ---- Plain TCP: the same frames, the same aligned receive buffers and checks, no TLS ----

asio::awaitable<message> tcp_receive(asio::ip::tcp::socket& s, const frame_limits& limits) {
  std::byte header[frame_header_bytes];
  co_await asio::async_read(s, asio::buffer(header), asio::use_awaitable);
  const std::uint32_t len = read_frame_length(header);
  if (auto why = check_frame_length(len, limits)) die(*why);
  aligned_bytes buf = aligned_bytes::allocate(frame_header_bytes + len);
  std::memcpy(buf.data(), header, frame_header_bytes);
  co_await asio::async_read(s, asio::buffer(buf.data() + frame_header_bytes, len), asio::use_awaitable);
  co_return must(decode_frame(std::move(buf), limits), "decode");
}

asio::awaitable<void> tcp_send(asio::ip::tcp::socket& s, message_builder&& m) {
  const auto f = m.frame();
  co_await asio::async_write(s, asio::buffer(f.data(), f.size()), asio::use_awaitable);
}

double tcp_throughput(io_thread& server_io, io_thread& client_io, const bench_options& o, int warmup) {
  const std::size_t n_floats = o.message_bytes / sizeof(float);
  asio::ip::tcp::acceptor acceptor(server_io.executor(), {asio::ip::make_address("127.0.0.1"), 0});
  const auto port = acceptor.local_endpoint().port();
  // Both ends of the measured interval are taken where the messages arrive: from the last
  // warm-up message to the last one, exactly n_messages arrive (queues play no part).
  clock_type::time_point t0;
  std::promise<clock_type::time_point> done;
  // A named closure: the coroutine refers to its captures until the future is ready.
  auto received_fn = [&]() -> asio::awaitable<void> {
    auto s = co_await acceptor.async_accept(asio::use_awaitable);
    s.set_option(asio::ip::tcp::no_delay(true));
    const frame_limits limits;
    for (int i = 0; i < warmup + o.n_messages; ++i) {
      message m = co_await tcp_receive(s, limits);
      check_big(m, static_cast<std::uint64_t>(i), n_floats);
      if (i == warmup - 1) t0 = clock_type::now();
    }
    done.set_value(clock_type::now());
  };
  auto received = server_io.spawn(received_fn());
  // A named closure: the coroutine refers to its captures until the future is ready.
  auto sent_fn = [&]() -> asio::awaitable<void> {
    asio::ip::tcp::socket s(co_await asio::this_coro::executor);
    co_await s.async_connect({asio::ip::make_address("127.0.0.1"), port}, asio::use_awaitable);
    s.set_option(asio::ip::tcp::no_delay(true));
    auto data = big_payload(o.message_bytes);
    for (int i = 0; i < warmup + o.n_messages; ++i) {
      data[0] = static_cast<float>(i);
      co_await tcp_send(s, big_message(data, static_cast<std::uint64_t>(i)));
    }
  };
  auto sent = client_io.spawn(sent_fn());
  const auto t1 = done.get_future().get();
  sent.get();
  received.get();
  return static_cast<double>(o.message_bytes) * o.n_messages / std::chrono::duration<double>(t1 - t0).count();
}

latency tcp_round_trips(io_thread& server_io, io_thread& client_io, const bench_options& o) {
  const int warmup = 200;
  const int n = warmup + o.n_round_trips;
  asio::ip::tcp::acceptor acceptor(server_io.executor(), {asio::ip::make_address("127.0.0.1"), 0});
  const auto port = acceptor.local_endpoint().port();
  // A named closure: the coroutine refers to its captures until the future is ready.
  auto echo_fn = [&]() -> asio::awaitable<void> {
    auto s = co_await acceptor.async_accept(asio::use_awaitable);
    s.set_option(asio::ip::tcp::no_delay(true));
    const frame_limits limits;
    for (int i = 0; i < n; ++i) {
      message m = co_await tcp_receive(s, limits);
      const auto* a = m.as<wire::Activations>();
      const tensor_view v = view_of(*a->activation());
      protocol::step_key key;
      key.step = a->step();
      key.block = 1;
      const tensor_source t{v.dtype, v.shape, v.data.data(), "gradient"};
      co_await tcp_send(s, protocol::make_gradients(key, t));
    }
  };
  auto echo = server_io.spawn(echo_fn());
  std::vector<double> us;
  // A named closure: the coroutine refers to its captures until the future is ready.
  auto client_fn = [&]() -> asio::awaitable<void> {
    asio::ip::tcp::socket s(co_await asio::this_coro::executor);
    co_await s.async_connect({asio::ip::make_address("127.0.0.1"), port}, asio::use_awaitable);
    s.set_option(asio::ip::tcp::no_delay(true));
    const frame_limits limits;
    const std::vector<std::uint8_t> data(o.small_bytes, 7);
    for (int i = 0; i < n; ++i) {
      const auto t0 = clock_type::now();
      co_await tcp_send(s, small_message(data, static_cast<std::uint64_t>(i)));
      message m = co_await tcp_receive(s, limits);
      const auto t1 = clock_type::now();
      if (!m.as<wire::Gradients>()) die("unexpected reply");
      if (i >= warmup) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
  };
  auto client = client_io.spawn(client_fn());
  client.get();
  echo.get();
  return percentiles(std::move(us));
}

bench_options parse(int argc, char** argv) {
  bench_options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> int {
      if (i + 1 >= argc) die("missing value after " + a);
      return std::atoi(argv[++i]);
    };
    if (a == "--messages") {
      o.n_messages = std::max(1, next());
    } else if (a == "--round-trips") {
      o.n_round_trips = std::max(10, next());
    } else if (a == "--rounds") {
      o.n_rounds = std::max(1, next());
    } else if (a == "--only" && i + 1 < argc) {
      o.only = argv[++i];
    } else if (a == "--quick") {
      o.n_messages = 16;
      o.n_round_trips = 500;
      o.n_rounds = 1;
    } else {
      die("usage: bench_transport [--messages N] [--round-trips N] [--rounds N] [--quick] [--only tls|tcp|grpc]");
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const bench_options o = parse(argc, argv);
  logger()->set_level(spdlog::level::warn);

  std::string templ = (std::filesystem::temp_directory_path() / "cleave-bench-XXXXXX").string();
  if (!::mkdtemp(templ.data())) die("cannot create a temporary directory");
  const std::filesystem::path dir = templ;
  struct remove_dir {
    std::filesystem::path p;
    ~remove_dir() {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  } cleanup{dir};
  init_ca(dir);
  issue_options server_opts;
  server_opts.role = core::tier::server;
  server_opts.dns_names = {"localhost"};
  issue_certificate(dir, "server-1", server_opts);
  issue_options device_opts;
  issue_certificate(dir, "device-1", device_opts);
  const tls_context server_ctx(tls_files_in(dir, "server-1"));
  const tls_context client_ctx(tls_files_in(dir, "device-1"));

  std::printf("cleave transport bench: loopback, %d rounds of %d x %zu MiB messages, %d x %zu B round trips\n",
              o.n_rounds, o.n_messages, o.message_bytes >> 20, o.n_round_trips, o.small_bytes);
  const auto want = [&](const char* part) { return o.only.empty() || o.only == part; };
  std::vector<double> tls_bps, tcp_bps, grpc_bps, ceiling_bps;
  latency tls_rtt, tcp_rtt, grpc_rtt;
#ifdef CLEAVE_BENCH_GRPC
  const grpc_bench_files files{(dir / "ca.crt").string(), (dir / "server-1.crt").string(),
                               (dir / "server-1.key").string(), (dir / "device-1.crt").string(),
                               (dir / "device-1.key").string()};
  grpc_bench grpc(files, o.message_bytes * 2 + (1 << 20));
#endif
  {
    io_thread server_io, client_io;
    listener lis(server_io.executor(), server_ctx, {asio::ip::make_address("127.0.0.1"), 0});
    // An unmeasured round first: it fills the buffer pools (page faults) and warms everything up.
    if (want("tcp")) tcp_throughput(server_io, client_io, o, 16);
    if (want("tls")) tls_throughput(server_io, client_io, lis, client_ctx, o, 16);
    // Then alternate, so that load from other processes falls on every transport alike.
    for (int r = 0; r < o.n_rounds; ++r) {
      if (want("tcp")) tcp_bps.push_back(tcp_throughput(server_io, client_io, o, 8));
      if (want("tls")) tls_bps.push_back(tls_throughput(server_io, client_io, lis, client_ctx, o, 8));
      if (want("tls")) ceiling_bps.push_back(openssl_ceiling(server_ctx, client_ctx, o, 8));
#ifdef CLEAVE_BENCH_GRPC
      if (want("grpc")) grpc_bps.push_back(grpc.upload(o.message_bytes, o.n_messages, 8));
#endif
      std::printf("  round %d: TCP %5.2f GB/s, TLS %5.2f GB/s", r + 1, tcp_bps.empty() ? 0 : tcp_bps.back() / 1e9,
                  tls_bps.empty() ? 0 : tls_bps.back() / 1e9);
      if (!ceiling_bps.empty()) std::printf(" (blocking OpenSSL %5.2f GB/s)", ceiling_bps.back() / 1e9);
      if (!grpc_bps.empty()) std::printf(", gRPC %5.2f GB/s", grpc_bps.back() / 1e9);
      std::printf("\n");
    }
    if (want("tcp")) tcp_rtt = tcp_round_trips(server_io, client_io, o);
    if (want("tls")) tls_rtt = tls_round_trips(server_io, client_io, lis, client_ctx, o);
  }
#ifdef CLEAVE_BENCH_GRPC
  if (want("grpc")) {
    const auto [p50, p99] = grpc.echo(o.small_bytes, o.n_round_trips);
    grpc_rtt = {p50, p99};
  }
#endif
  const double tls = median(tls_bps), tcp = median(tcp_bps), grpc_median = median(grpc_bps);
  if (!tls_bps.empty()) {
    std::printf("  throughput, TLS 1.3 channel : %6.2f GB/s (median)\n", tls / 1e9);
    std::printf("  ceiling, blocking OpenSSL   : %6.2f GB/s (median; same contexts, no framing, two threads)\n",
                median(ceiling_bps) / 1e9);
  }
  if (!tcp_bps.empty()) std::printf("  throughput, plain TCP       : %6.2f GB/s (median)\n", tcp / 1e9);
  if (!tls_bps.empty() && !tcp_bps.empty())
    std::printf("  ratio TLS / TCP             : %6.2f   (target >= 0.5)  %s\n", tls / tcp,
                tls / tcp >= 0.5 ? "met" : "NOT MET");
  if (!tls_bps.empty())
    std::printf("  RTT %zu B, TLS channel     : p50 %6.1f us  p99 %6.1f us   (target p50 < 100 us)  %s\n",
                o.small_bytes, tls_rtt.p50_us, tls_rtt.p99_us, tls_rtt.p50_us < 100 ? "met" : "NOT MET");
  if (!tcp_bps.empty())
    std::printf("  RTT %zu B, plain TCP       : p50 %6.1f us  p99 %6.1f us\n", o.small_bytes, tcp_rtt.p50_us,
                tcp_rtt.p99_us);
#ifdef CLEAVE_BENCH_GRPC
  if (!grpc_bps.empty()) {
    std::printf("  throughput, gRPC mutual TLS : %6.2f GB/s (median)\n", grpc_median / 1e9);
    if (!tls_bps.empty())
      std::printf("  ratio cleave / gRPC         : %6.2f   (target >= 4)  %s\n", tls / grpc_median,
                  tls / grpc_median >= 4 ? "met" : "NOT MET");
    std::printf("  RTT %zu B, gRPC unary      : p50 %6.1f us  p99 %6.1f us\n", o.small_bytes, grpc_rtt.p50_us,
                grpc_rtt.p99_us);
  }
#else
  (void)grpc_median;
  std::printf("  gRPC: not built (install it with scripts/setup.sh bench/transport/packages.txt, reconfigure)\n");
#endif
  return 0;
}
