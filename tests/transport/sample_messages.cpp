// Samples of every message type, filled with a known byte pattern.
#include "sample_messages.h"

#include <array>
#include <cmath>

namespace cleave::transport::testing {

namespace {

std::vector<std::byte> pattern(std::size_t n) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = pattern_byte(i);
  return v;
}

}  // namespace

std::vector<std::pair<std::string, message_builder>> sample_messages() {
  std::vector<std::pair<std::string, message_builder>> out;
  const auto act = pattern(4 * 3 * 2 * 5 * 5);  // f32 (3,2,5,5)
  const auto labels = pattern(4 * 3);           // i32 (3)
  const auto w0 = pattern(4 * 8 * 4);           // f32 (8,4)
  const auto w1 = pattern(2 * 8);               // bf16 (8)
  const auto m0 = pattern(1 * 7);               // u8 (7)

  const backend_desc backends[] = {{"reference", 1.5f, 1u << 30}, {"onednn", 120.f, 8ull << 30}};
  hello_info hello;
  hello.role = core::tier::device;
  hello.node_id = 7;
  hello.name = "device-7";
  hello.backends = backends;
  hello.memory_bytes = 4ull << 30;
  hello.gflops = 42.5f;
  hello.n_samples = 6000;
  out.emplace_back("Hello", make_hello(hello));

  welcome_info welcome;
  welcome.node_id = 7;
  welcome.run_id = 99;
  welcome.plan_epoch = 3;
  welcome.heartbeat_ms = 1000;
  welcome.per_device_replicas = true;
  out.emplace_back("Welcome", make_welcome(welcome));

  const stage_desc stages_a[] = {
      {7, core::tier::device, 0, 2, false}, {1, core::tier::edge, 2, 4, false}, {0, core::tier::server, 4, 9, true}};
  const stage_desc stages_b[] = {{8, core::tier::device, 0, 3, false}, {0, core::tier::server, 3, 9, true}};
  const device_plan_desc devices[] = {{7, stages_a}, {8, stages_b}};
  plan_info plan;
  plan.epoch = 3;
  plan.n_blocks = 9;
  plan.model = "lenet5";
  plan.micro_batch_size = 16;
  plan.n_micro_batches = 4;
  plan.devices = devices;
  out.emplace_back("Plan", make_plan(plan));

  step_key key;
  key.epoch = 3;
  key.step = 1234;
  key.micro_batch = 2;
  key.device_id = 7;
  key.block = 2;
  const tensor_source a{core::dtype::f32, {3, 2, 5, 5}, act.data(), "a2"};
  const tensor_source l{core::dtype::i32, {3}, labels.data(), "labels"};
  out.emplace_back("Activations", make_activations(key, a, &l));
  out.emplace_back("Gradients", make_gradients(key, a, 0.75f, 2));

  round_start_info rs;
  rs.round = 5;
  rs.epoch = 3;
  rs.local_steps = 10;
  rs.deadline_ms = 30000;
  rs.learning_rate = 0.01f;
  out.emplace_back("RoundStart", make_round_start(rs));

  const tensor_source weights[] = {{core::dtype::f32, {8, 4}, w0.data(), "fc.w"},
                                   {core::dtype::bf16, {8}, w1.data(), "fc.b"}};
  replica_info rep;
  rep.round = 5;
  rep.node_id = 7;
  rep.first_block = 0;
  rep.end_block = 2;
  rep.n_samples = 640;
  out.emplace_back("ReplicaUpload", make_replica_upload(rep, weights));

  global_weights_info gw;
  gw.round = 5;
  gw.first_block = 0;
  gw.end_block = 2;
  out.emplace_back("GlobalWeights", make_global_weights(gw, weights));

  const block_profile_desc blocks[] = {{0, 120.f, 250.f, 1u << 20, 4096}, {1, 80.f, 160.f, 1u << 19, 2048}};
  const link_profile_desc links[] = {{0, 350.f, 1.2e8f}};
  profile_info prof;
  prof.node_id = 7;
  prof.epoch = 3;
  prof.step = 1234;
  prof.memory_budget_bytes = 2ull << 30;
  prof.blocks = blocks;
  prof.links = links;
  prof.batch = 32;
  prof.backend = "onednn";
  out.emplace_back("Profile", make_profile(prof));

  const tensor_source state[] = {{core::dtype::u8, {7}, m0.data(), "momentum"}};
  migrate_info mig;
  mig.epoch = 4;
  mig.step = 1240;
  mig.first_block = 2;
  mig.end_block = 4;
  mig.from_node = 1;
  mig.to_node = 0;
  mig.device_id = 1;
  mig.to_role = core::tier::server;
  mig.optimizer_steps = 17;
  out.emplace_back("Migrate", make_migrate(mig, weights, state));
  out.emplace_back("Cutover", make_cutover(3, 5, 1240));

  out.emplace_back("Ping", make_ping(1, 123456789));
  out.emplace_back("Pong", make_pong(1, 123456789));
  out.emplace_back("Error", make_error(wire::ErrorCode::stale_epoch, "plan epoch 2 is older than 3"));
  {
    message_builder leave(128);
    const auto reason = leave.fbb().CreateString("link lost");
    leave.finish(wire::CreateLeave(leave.fbb(), 3, reason));
    out.emplace_back("Leave", std::move(leave));
  }
  {
    // A secure aggregation message with every list filled (built by hand: the network layer
    // knows the schema, not the protocol's builders).
    message_builder sa(1024);
    auto& f = sa.fbb();
    std::vector<std::uint8_t> key(32);
    for (std::size_t i = 0; i < key.size(); ++i) key[i] = std::to_integer<std::uint8_t>(pattern_byte(i));
    const auto k = wire::CreateSecAggKey(f, 3, f.CreateVector(key), f.CreateVector(key));
    const std::vector<std::uint8_t> blob_bytes{1, 2, 3, 4};
    const auto blob = wire::CreateSecAggBlob(f, 7, f.CreateVector(blob_bytes));
    const std::vector<std::uint32_t> ids{3, 7, 9}, dropped{9}, blocks{0, 4};
    const std::vector<std::uint64_t> words{0x0123456789abcdefULL, 42, ~0ULL};
    sa.finish(wire::CreateSecAgg(f, wire::SecAggPhase::mask_set, 2, 3, f.CreateVector(&k, 1), 2,
                                 f.CreateVector(&blob, 1), f.CreateVector(ids), f.CreateVector(dropped),
                                 f.CreateVector(blocks), f.CreateVector(words)));
    out.emplace_back("SecAgg", std::move(sa));
  }
  return out;
}

}  // namespace cleave::transport::testing

namespace cleave::transport::testing {

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
  const core::shape s{3, 2, 5, 5};
  for (core::codec c : {core::codec::f16, core::codec::bf16, core::codec::int8}) {
    message_builder m;
    core::codec_spec spec;
    spec.id = c;
    const auto a = m.add_encoded_tensor(spec, s, "activation", x.data(), nullptr);
    const auto l = m.add_tensor({core::dtype::i32, {3}, labels, "labels"});
    m.finish(wire::CreateActivations(m.fbb(), 3, 1234, 2, 7, 2, a, l));
    out.emplace_back("Activations_" + std::string(core::codec_name(c)), std::move(m));
  }
  for (core::codec c : {core::codec::f16, core::codec::int8, core::codec::topk}) {
    message_builder m;
    core::codec_spec spec;
    spec.id = c;
    spec.topk_fraction = 0.1f;
    const auto g = m.add_encoded_tensor(spec, s, "gradient", x.data(), nullptr);
    m.finish(wire::CreateGradients(m.fbb(), 3, 1234, 2, 7, 2, g, 0.5f, 1));
    out.emplace_back("Gradients_" + std::string(core::codec_name(c)), std::move(m));
  }
  return out;
}

}  // namespace cleave::transport::testing
