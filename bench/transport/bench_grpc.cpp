// gRPC with mutual TLS over loopback: client-streaming upload throughput and unary echo latency,
// with the federation certificates of the cleave side.
#include "bench_grpc.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "bench.grpc.pb.h"

namespace {

using clock_type = std::chrono::steady_clock;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_transport (gRPC): %s\n", what.c_str());
  std::exit(1);
}

class bench_service final : public cleave::bench::Bench::Service {
 public:
  grpc::Status Upload(grpc::ServerContext*, grpc::ServerReader<cleave::bench::Blob>* reader,
                      cleave::bench::Ack* ack) override {
    cleave::bench::Blob b;
    std::uint64_t n = 0, bytes = 0;
    while (reader->Read(&b)) {
      ++n;
      bytes += b.data().size();
    }
    ack->set_count(n);
    ack->set_bytes(bytes);
    return grpc::Status::OK;
  }
  grpc::Status Echo(grpc::ServerContext*, const cleave::bench::Blob* in, cleave::bench::Blob* out) override {
    *out = *in;
    return grpc::Status::OK;
  }
};

}  // namespace

struct grpc_bench::impl {
  bench_service service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<cleave::bench::Bench::Stub> stub;
};

grpc_bench::grpc_bench(const grpc_bench_files& files, std::size_t max_message_bytes) : impl_(std::make_unique<impl>()) {
  const int max_message = static_cast<int>(max_message_bytes);
  grpc::SslServerCredentialsOptions server_opts(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  server_opts.pem_root_certs = read_file(files.ca);
  server_opts.pem_key_cert_pairs.push_back({read_file(files.server_key), read_file(files.server_cert)});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(server_opts), &port);
  builder.RegisterService(&impl_->service);
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || port == 0) die("cannot start the gRPC server");

  grpc::SslCredentialsOptions client_opts;
  client_opts.pem_root_certs = read_file(files.ca);
  client_opts.pem_private_key = read_file(files.client_key);
  client_opts.pem_cert_chain = read_file(files.client_cert);
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("server-1");
  args.SetMaxReceiveMessageSize(max_message);
  args.SetMaxSendMessageSize(max_message);
  auto channel =
      grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), grpc::SslCredentials(client_opts), args);
  impl_->stub = cleave::bench::Bench::NewStub(channel);
}

grpc_bench::~grpc_bench() {
  impl_->server->Shutdown();
}

double grpc_bench::upload(std::size_t bytes, int n, int warmup) {
  std::vector<float> payload(bytes / sizeof(float));
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<float>(i);
  grpc::ClientContext ctx;
  cleave::bench::Ack ack;
  auto writer = impl_->stub->Upload(&ctx, &ack);
  cleave::bench::Blob blob;
  clock_type::time_point t0;
  for (int i = 0; i < warmup + n; ++i) {
    if (i == warmup) t0 = clock_type::now();
    payload[0] = static_cast<float>(i);
    blob.set_seq(static_cast<std::uint64_t>(i));
    blob.set_data(payload.data(), payload.size() * sizeof(float));
    if (!writer->Write(blob)) die("upload write failed");
  }
  writer->WritesDone();
  const grpc::Status st = writer->Finish();
  const auto t1 = clock_type::now();
  if (!st.ok()) die("upload: " + st.error_message());
  if (ack.count() != static_cast<std::uint64_t>(warmup + n)) die("upload: the server counted other messages");
  return static_cast<double>(bytes) * n / std::chrono::duration<double>(t1 - t0).count();
}

std::pair<double, double> grpc_bench::echo(std::size_t bytes, int n) {
  cleave::bench::Blob small;
  small.set_data(std::string(bytes, '\7'));
  std::vector<double> us;
  const int warmup = 200;
  for (int i = 0; i < warmup + n; ++i) {
    grpc::ClientContext ctx;
    cleave::bench::Blob reply;
    small.set_seq(static_cast<std::uint64_t>(i));
    const auto t0 = clock_type::now();
    const grpc::Status st = impl_->stub->Echo(&ctx, small, &reply);
    const auto t1 = clock_type::now();
    if (!st.ok() || reply.seq() != static_cast<std::uint64_t>(i)) die("echo failed: " + st.error_message());
    if (i >= warmup) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)]};
}
