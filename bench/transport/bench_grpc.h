// The gRPC side of bench_transport: the same payloads over gRPC with mutual TLS (built only when
// gRPC is installed; the build then defines CLEAVE_BENCH_GRPC).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

struct grpc_bench_files {
  std::string ca;
  std::string server_cert;
  std::string server_key;
  std::string client_cert;
  std::string client_key;
};

// An in-process gRPC server and a client channel to it, both with the federation certificates.
class grpc_bench {
 public:
  grpc_bench(const grpc_bench_files& files, std::size_t max_message_bytes);
  ~grpc_bench();

  // Client-streaming upload of `n` messages of `bytes` after `warmup` unmeasured ones; bytes/s
  // from the first to the last measured message, acknowledged by the server.
  double upload(std::size_t bytes, int n, int warmup);
  // Unary echo of `bytes`: (p50, p99) round-trip time in microseconds over `n` calls.
  std::pair<double, double> echo(std::size_t bytes, int n);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};
