// Samples of every message type, written by the builders nodes use, with the fields they fill.
#include "sample_messages.h"

#include <array>
#include <cmath>
#include <cstdint>

#include "cleave/protocol/protocol.h"

namespace cleave::transport::testing {

namespace {

// A device's step: key of micro-batch 2 of step 1234 at the cut before block 1, second attempt
// at its round (a round nobody finished runs again).
protocol::step_key sample_key() {
  protocol::step_key key;
  key.epoch = 3;
  key.step = 1234;
  key.micro_batch = 2;
  key.device_id = 7;
  key.block = 1;
  key.attempt = 2;
  return key;
}

// 12 samples a step in 4 micro-batches of 3.
constexpr protocol::batch_info sample_batch{12, 4};

std::vector<float> ramp(std::size_t n, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * std::cos(0.11f * static_cast<float>(i));
  return v;
}

}  // namespace

const char* sample_model_json() {
  return R"({"name": "sample", "input": [1, 8, 8], "classes": 4, "blocks": [)"
         R"({"type": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1}, {"type": "relu"},)"
         R"( {"type": "maxpool2d", "kernel": 2}, {"type": "flatten"}, {"type": "linear", "out_features": 4}]})";
}

std::vector<std::pair<std::string, message_builder>> sample_messages() {
  std::vector<std::pair<std::string, message_builder>> out;
  const auto x = encoded_sample_values();  // f32 (3,2,5,5)
  const std::int32_t labels[3] = {1, 0, 3};
  const auto params = ramp(40, 0.5f), buffers = ramp(8, 1.0f);
  // device 7: [0,1) on the device, [1,3) on edge 1, [3,5) and the loss on the server
  const split::route route = split::make_route(false, true, {1, 3}, 5);

  const protocol::backend_desc backends[] = {{"reference", 1.5f, 1u << 30}, {"onednn", 120.f, 8ull << 30}};
  protocol::hello_info hello;
  hello.role = core::tier::device;
  hello.node_id = 7;
  hello.name = "device-7";
  hello.backends = backends;
  hello.memory_bytes = 4ull << 30;
  hello.gflops = 42.5f;
  hello.n_samples = 6000;
  out.emplace_back("Hello", protocol::make_hello(hello));

  protocol::welcome_info welcome;
  welcome.node_id = 7;
  welcome.run_id = 99;
  welcome.plan_epoch = 3;
  welcome.heartbeat_ms = 1000;
  welcome.per_device_replicas = true;
  out.emplace_back("Welcome", protocol::make_welcome(welcome));

  protocol::plan_desc plan;
  plan.epoch = 3;
  plan.model_json = sample_model_json();
  plan.training.opt.momentum = 0.8f;
  plan.training.seed = 17;
  plan.micro_batch_size = 3;
  plan.n_micro_batches = 4;
  plan.device_id = 7;
  plan.edge_id = 1;
  plan.route = route;
  plan.run_id = 99;
  plan.device_micro_batches = 2;
  plan.hops = {{core::codec::int8, core::codec::f32}, {core::codec::f16, core::codec::topk}};
  plan.topk_fraction = 0.05f;
  plan.topk_feedback = true;
  out.emplace_back("Plan", protocol::make_plan(plan));

  const tensor_source a{core::dtype::f32, {3, 2, 5, 5}, x.data(), "activation"};
  const tensor_source l{core::dtype::i32, {3}, labels, "labels"};
  const tensor_source g{core::dtype::f32, {3, 2, 5, 5}, x.data(), "gradient"};
  out.emplace_back("Activations", protocol::make_activations(sample_key(), sample_batch, a, &l));
  out.emplace_back("Gradients", protocol::make_gradients(sample_key(), g, 0.75f, 2));

  const std::uint32_t round_devices[] = {7, 8};
  protocol::round_start_desc rs;
  rs.round = 5;
  rs.epoch = 3;
  rs.local_steps = 10;
  rs.deadline_ms = 30000;
  rs.learning_rate = 0.01f;
  rs.device_id = 7;
  rs.devices = round_devices;
  rs.attempt = 2;
  out.emplace_back("RoundStart", protocol::make_round_start(rs));

  const std::uint32_t trained[] = {7};
  protocol::replica_desc rep;
  rep.round = 5;
  rep.node_id = 7;
  rep.first_block = 0;
  rep.end_block = 1;
  rep.n_samples = 640;
  rep.devices = trained;
  rep.stats = {1200000, 0, 0, 1.25 * 640, 640, 512};
  rep.attempt = 2;
  out.emplace_back("ReplicaUpload", protocol::make_replica_upload(rep, params, buffers));

  protocol::global_weights_desc gw;
  gw.round = 5;
  gw.n_blocks = 5;
  gw.device_id = 7;
  gw.test_accuracy = 0.82f;
  gw.test_loss = 0.51f;
  out.emplace_back("GlobalWeights", protocol::make_global_weights(gw, params, buffers));

  split::node_profile prof;
  prof.node_id = 7;
  prof.batch = 32;
  prof.backend = "onednn";
  prof.memory_budget_bytes = 2ull << 30;
  for (int b = 0; b < 5; ++b)
    prof.blocks.push_back({120e-6 * (b + 1), 250e-6 * (b + 1), 1u << 16, 1u << 17, 4096, 2048});
  prof.links = {{0, 350.f, 1.2e8f}, {1, 90.f, 0.f}};
  out.emplace_back("Profile", protocol::make_profile(prof, 3, 1234));

  // The edge hands blocks [1,3) of device 7 to the server under the new route.
  split::block_state moved;
  moved.begin = 1;
  moved.end = 3;
  moved.params = params;
  moved.buffers = buffers;
  moved.optimizer_state = {ramp(40, 0.1f)};
  moved.optimizer_steps = 17;
  protocol::migrate_desc mig;
  mig.epoch = 4;
  mig.step = 1240;
  mig.device_id = 7;
  mig.edge_id = 1;
  mig.from = core::tier::edge;
  mig.from_node = 1;
  out.emplace_back("Migrate", protocol::make_migrate(mig, split::make_route(false, false, {1}, 5), moved));
  out.emplace_back("Cutover", protocol::make_cutover(7, 4, 1240));

  out.emplace_back("Ping", make_ping(1, 123456789));
  out.emplace_back("Pong", make_pong(1, 123456789));
  out.emplace_back("Error", make_error(wire::ErrorCode::stale_epoch, "plan epoch 2 is older than 3"));
  out.emplace_back("Leave", protocol::make_leave({3, "link lost"}));

  // A mask set with every list filled.
  privacy::roster_entry key;
  key.id = 3;
  for (std::size_t i = 0; i < key.mask_public.size(); ++i) {
    key.mask_public[i] = static_cast<std::uint8_t>(i * 131u + 7u);
    key.encrypt_public[i] = static_cast<std::uint8_t>(i * 17u + 1u);
  }
  const privacy::addressed blob{7, {1, 2, 3, 4}};
  const std::uint32_t ids[] = {3, 7, 9}, dropped[] = {9}, blocks[] = {0, 4};
  const std::uint64_t words[] = {0x0123456789abcdefULL, 42, ~0ULL};
  protocol::secagg_desc sa;
  sa.phase = wire::SecAggPhase::mask_set;
  sa.round = 2;
  sa.device_id = 3;
  sa.keys = std::span(&key, 1);
  sa.threshold = 2;
  sa.blobs = std::span(&blob, 1);
  sa.devices = ids;
  sa.dropped = dropped;
  sa.blocks = blocks;
  sa.words = words;
  out.emplace_back("SecAgg", protocol::make_secagg(sa));
  // The transport carries the list's bytes; the node checks them against its CA.
  const std::uint8_t crl[] = {0x30, 0x03, 0x02, 0x01, 0x07};
  out.emplace_back("Revocations", protocol::make_revocations(crl));
  protocol::admin_request ask{"submit", 0, "job.toml", {'r', 'o', 'u', 'n', 'd', 's', '=', '2', '\n'}, 0};
  out.emplace_back("AdminRequest", protocol::make_admin_request(ask));
  protocol::admin_reply answer{true, "job 3 queued", {}, 0, true, 3};
  out.emplace_back("AdminReply", protocol::make_admin_reply(answer));
  return out;
}

std::vector<float> encoded_sample_values() {
  std::vector<float> x(3 * 2 * 5 * 5);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(0.37f * static_cast<float>(i)) * static_cast<float>(1 + (i / 25) % 2);
  return x;
}

std::vector<std::pair<std::string, message_builder>> encoded_step_messages() {
  std::vector<std::pair<std::string, message_builder>> out;
  const auto x = encoded_sample_values();
  const std::int32_t labels[3] = {1, 0, 2};
  const tensor_source l{core::dtype::i32, {3}, labels, "labels"};
  for (core::codec c : {core::codec::f16, core::codec::bf16, core::codec::int8}) {
    core::codec_spec spec;
    spec.id = c;
    const tensor_source a{core::dtype::f32, {3, 2, 5, 5}, x.data(), "activation"};
    out.emplace_back("Activations_" + std::string(core::codec_name(c)),
                     protocol::make_activations(sample_key(), sample_batch, a, &l, spec));
  }
  for (core::codec c : {core::codec::f16, core::codec::int8, core::codec::topk}) {
    core::codec_spec spec;
    spec.id = c;
    spec.topk_fraction = 0.1f;
    const tensor_source g{core::dtype::f32, {3, 2, 5, 5}, x.data(), "gradient"};
    out.emplace_back("Gradients_" + std::string(core::codec_name(c)),
                     protocol::make_gradients(sample_key(), g, 0.5f, 1, spec));
  }
  return out;
}

}  // namespace cleave::transport::testing
