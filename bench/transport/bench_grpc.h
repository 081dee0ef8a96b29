// The gRPC side of bench_transport: the same payloads over gRPC with mutual TLS (built only when
// gRPC is installed; defines CLEAVE_BENCH_GRPC).
#pragma once

#include <cstddef>
#include <string>

struct grpc_bench_files {
  std::string ca;
  std::string server_cert;
  std::string server_key;
  std::string client_cert;
  std::string client_key;
};

struct grpc_figures {
  double bytes_per_second = 0;  // client-streaming upload of message_bytes messages
  double rtt_p50_us = 0;        // unary echo of small_bytes
  double rtt_p99_us = 0;
};

grpc_figures run_grpc_bench(const grpc_bench_files& files, std::size_t message_bytes, int n_messages, int n_round_trips,
                            std::size_t small_bytes);
