// Transport benchmark, one run over loopback: throughput of 4 MiB tensor messages over the TLS 1.3
// channel and over plain TCP with the same framing and checks, round-trip time of 1 KiB messages
// (p50, p99), and the same over gRPC with mutual TLS when it was found at build time.
#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
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
  global_weights_info info;
  info.round = seq;
  info.end_block = 1;
  const tensor_source t{core::dtype::f32, {static_cast<std::int64_t>(data.size())}, data.data(), {}};
  return make_global_weights(info, std::span(&t, 1));
}

message_builder small_message(const std::vector<std::uint8_t>& data, std::uint64_t seq) {
  step_key key;
  key.step = seq;
  key.block = 1;
  const tensor_source t{core::dtype::u8, {static_cast<std::int64_t>(data.size())}, data.data(), {}};
  return make_activations(key, t);
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

latency percentiles(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  const auto at = [&](double q) { return us[std::min(us.size() - 1, static_cast<std::size_t>(q * us.size()))]; };
  return {at(0.50), at(0.99)};
}

// ---- TLS channel ----

double tls_throughput(io_thread& server_io, io_thread& client_io, listener& lis, const tls_context& client_ctx,
                      const bench_options& o) {
  const std::size_t n_floats = o.message_bytes / sizeof(float);
  const int warmup = 24;  // fills the buffer pool and the sender queue first
  std::promise<clock_type::time_point> done;
  // A named closure: the coroutine refers to its captures until the future is ready.
  auto received_fn = [&]() -> asio::awaitable<void> {
    channel ch = must(co_await lis.accept(), "accept");
    for (int i = 0; i < warmup + o.n_messages; ++i) {
      message m = must(co_await ch.receive(), "receive");
      check_big(m, static_cast<std::uint64_t>(i), n_floats);
    }
    done.set_value(clock_type::now());
    co_await ch.close();
  };
  auto received = server_io.spawn(received_fn());
  clock_type::time_point t0;
  // A named closure: the coroutine refers to its captures until the future is ready.
  auto sent_fn = [&]() -> asio::awaitable<void> {
    channel ch = must(co_await connect(client_ctx, "127.0.0.1", lis.port()), "connect");
    auto data = big_payload(o.message_bytes);
    for (int i = 0; i < warmup + o.n_messages; ++i) {
      if (i == warmup) t0 = clock_type::now();
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
      step_key key;
      key.step = a->step();
      key.block = 1;
      const tensor_source t{v.dtype, v.shape, v.data.data(), {}};
      must(co_await ch.send(make_gradients(key, t)), "send");
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

double tcp_throughput(io_thread& server_io, io_thread& client_io, const bench_options& o) {
  const std::size_t n_floats = o.message_bytes / sizeof(float);
  const int warmup = 24;  // fills the buffer pool and the sender queue first
  asio::ip::tcp::acceptor acceptor(server_io.executor(), {asio::ip::make_address("127.0.0.1"), 0});
  const auto port = acceptor.local_endpoint().port();
  std::promise<clock_type::time_point> done;
  // A named closure: the coroutine refers to its captures until the future is ready.
  auto received_fn = [&]() -> asio::awaitable<void> {
    auto s = co_await acceptor.async_accept(asio::use_awaitable);
    s.set_option(asio::ip::tcp::no_delay(true));
    const frame_limits limits;
    for (int i = 0; i < warmup + o.n_messages; ++i) {
      message m = co_await tcp_receive(s, limits);
      check_big(m, static_cast<std::uint64_t>(i), n_floats);
    }
    done.set_value(clock_type::now());
  };
  auto received = server_io.spawn(received_fn());
  clock_type::time_point t0;
  // A named closure: the coroutine refers to its captures until the future is ready.
  auto sent_fn = [&]() -> asio::awaitable<void> {
    asio::ip::tcp::socket s(co_await asio::this_coro::executor);
    co_await s.async_connect({asio::ip::make_address("127.0.0.1"), port}, asio::use_awaitable);
    s.set_option(asio::ip::tcp::no_delay(true));
    auto data = big_payload(o.message_bytes);
    for (int i = 0; i < warmup + o.n_messages; ++i) {
      if (i == warmup) t0 = clock_type::now();
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
      step_key key;
      key.step = a->step();
      key.block = 1;
      const tensor_source t{v.dtype, v.shape, v.data.data(), {}};
      co_await tcp_send(s, make_gradients(key, t));
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
    } else if (a == "--only" && i + 1 < argc) {
      o.only = argv[++i];
    } else if (a == "--quick") {
      o.n_messages = 16;
      o.n_round_trips = 500;
    } else {
      die("usage: bench_transport [--messages N] [--round-trips N] [--quick] [--only tls|tcp|grpc]");
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
  server_opts.role = node_role::server;
  server_opts.dns_names = {"localhost"};
  issue_certificate(dir, "server-1", server_opts);
  issue_options device_opts;
  issue_certificate(dir, "device-1", device_opts);
  const tls_context server_ctx(tls_files_in(dir, "server-1"));
  const tls_context client_ctx(tls_files_in(dir, "device-1"));

  std::printf("cleave transport bench: loopback, %d x %zu MiB messages, %d x %zu B round trips\n", o.n_messages,
              o.message_bytes >> 20, o.n_round_trips, o.small_bytes);
  double tls_bps = 0, tcp_bps = 0;
  latency tls_rtt, tcp_rtt;
  {
    io_thread server_io, client_io;
    listener lis(server_io.executor(), server_ctx, {asio::ip::make_address("127.0.0.1"), 0});
    const auto want = [&](const char* part) { return o.only.empty() || o.only == part; };
    if (want("tcp")) tcp_bps = tcp_throughput(server_io, client_io, o);
    if (want("tls")) tls_bps = tls_throughput(server_io, client_io, lis, client_ctx, o);
    if (want("tcp")) tcp_rtt = tcp_round_trips(server_io, client_io, o);
    if (want("tls")) tls_rtt = tls_round_trips(server_io, client_io, lis, client_ctx, o);
  }
  if (!o.only.empty() && o.only != "grpc") {
    std::printf("  throughput %s: %.2f GB/s; RTT p50 %.1f us p99 %.1f us\n", o.only.c_str(), (tls_bps + tcp_bps) / 1e9,
                tls_rtt.p50_us + tcp_rtt.p50_us, tls_rtt.p99_us + tcp_rtt.p99_us);
    return 0;
  }
  std::printf("  throughput, TLS 1.3 channel : %6.2f GB/s\n", tls_bps / 1e9);
  std::printf("  throughput, plain TCP       : %6.2f GB/s\n", tcp_bps / 1e9);
  std::printf("  ratio TLS / TCP             : %6.2f   (target >= 0.5)  %s\n", tls_bps / tcp_bps,
              tls_bps / tcp_bps >= 0.5 ? "met" : "NOT MET");
  std::printf("  RTT %zu B, TLS channel     : p50 %6.1f us  p99 %6.1f us   (target p50 < 100 us)  %s\n", o.small_bytes,
              tls_rtt.p50_us, tls_rtt.p99_us, tls_rtt.p50_us < 100 ? "met" : "NOT MET");
  std::printf("  RTT %zu B, plain TCP       : p50 %6.1f us  p99 %6.1f us\n", o.small_bytes, tcp_rtt.p50_us,
              tcp_rtt.p99_us);
#ifdef CLEAVE_BENCH_GRPC
  if (o.only == "grpc") tls_bps = 1;
  grpc_bench_files files{(dir / "ca.crt").string(), (dir / "server-1.crt").string(), (dir / "server-1.key").string(),
                         (dir / "device-1.crt").string(), (dir / "device-1.key").string()};
  const grpc_figures g = run_grpc_bench(files, o.message_bytes, o.n_messages, o.n_round_trips, o.small_bytes);
  std::printf("  throughput, gRPC mutual TLS : %6.2f GB/s\n", g.bytes_per_second / 1e9);
  std::printf("  ratio cleave / gRPC         : %6.2f   (target >= 4)  %s\n", tls_bps / g.bytes_per_second,
              tls_bps / g.bytes_per_second >= 4 ? "met" : "NOT MET");
  std::printf("  RTT %zu B, gRPC unary      : p50 %6.1f us  p99 %6.1f us\n", o.small_bytes, g.rtt_p50_us, g.rtt_p99_us);
#else
  std::printf("  gRPC: not built (install it with scripts/setup.sh bench/transport/packages.txt, reconfigure)\n");
#endif
  return 0;
}
