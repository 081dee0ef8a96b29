// The training messages: one builder for each, and the readers that check what they read.
#include "cleave/protocol/protocol.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cleave/protocol/tensor_io.h"
#include "cleave/split/replan.h"

namespace cleave::protocol {

using transport::estimate_frame_bytes;
using transport::tensor_view;
using transport::view_of;

static_assert(static_cast<int>(wire::Role::server) == static_cast<int>(core::tier::server));
static_assert(static_cast<int>(wire::Role::edge) == static_cast<int>(core::tier::edge));
static_assert(static_cast<int>(wire::Role::device) == static_cast<int>(core::tier::device));

namespace {

// core::tier has the wire's numbers.
wire::Role role_of(core::tier t) {
  return static_cast<wire::Role>(t);
}

// The f32 tensor named `name` of a weights list, with exactly n elements.
std::span<const float> f32_tensor(const flatbuffers::Vector<flatbuffers::Offset<wire::Tensor>>* list,
                                  std::string_view name, std::int64_t n, const char* what) {
  if (list)
    for (const auto* t : *list) {
      const tensor_view v = view_of(*t);
      if (v.name != name) continue;
      if (v.dtype != core::dtype::f32 || v.numel() != n)
        throw core::error(std::string(what) + ": tensor '" + std::string(name) + "' holds " +
                          std::to_string(v.numel()) + " " + std::string(core::dtype_name(v.dtype)) +
                          " values, expected " + std::to_string(n) + " f32");
      return v.values<float>();
    }
  if (n == 0) return {};
  throw core::error(std::string(what) + ": no tensor '" + std::string(name) + "'");
}

}  // namespace

std::pair<core::tier, std::uint32_t> admitted_hello(const transport::message& m, const std::string& identity,
                                                    std::optional<core::tier> cert_role,
                                                    std::optional<std::uint32_t> cert_id) {
  const auto* h = m.as<wire::Hello>();
  if (!h) throw core::error("the first message was " + std::string(transport::body_name(m.type())) + ", not a Hello");
  if (h->protocol_version() != protocol_version)
    throw core::error("protocol version " + std::to_string(h->protocol_version()) + ", expected " +
                      std::to_string(protocol_version));
  const auto role = static_cast<core::tier>(h->role());
  if (cert_role && *cert_role != role)
    throw core::error("Hello claims role " + std::string(core::tier_name(role)) + " but the certificate says " +
                      std::string(core::tier_name(*cert_role)));
  // A device is who its certificate says: nobody claims, locks out or evicts another's id.
  if (role == core::tier::device) {
    if (!cert_id)
      throw core::error("certificate '" + identity +
                        "' binds no device id (issue it with `cleave certs issue --id N`, or name it DEVICE-N)");
    if (*cert_id != h->node_id())
      throw core::error("Hello claims device id " + std::to_string(h->node_id()) + " but certificate '" + identity +
                        "' is for device " + std::to_string(*cert_id));
  }
  return {role, h->node_id()};
}

message_builder make_hello(const hello_info& info) {
  message_builder b(256 + info.name.size() + info.backends.size() * 64);
  auto& f = b.fbb();
  const auto name = f.CreateString(info.name.data(), info.name.size());
  std::vector<flatbuffers::Offset<wire::BackendInfo>> backends;
  for (const auto& d : info.backends)
    backends.push_back(
        wire::CreateBackendInfo(f, f.CreateString(d.name.data(), d.name.size()), d.gflops, d.memory_bytes));
  const auto list = f.CreateVector(backends);
  b.finish(wire::CreateHello(f, info.version, role_of(info.role), info.node_id, name, list, info.memory_bytes,
                             info.gflops, info.n_samples));
  return b;
}

message_builder renamed_hello(const wire::Hello& h, std::string_view name) {
  std::vector<backend_desc> backends;
  if (h.backends())
    for (const auto* d : *h.backends())
      backends.push_back({d->name() ? d->name()->string_view() : std::string_view(), d->gflops(), d->memory_bytes()});
  hello_info info{static_cast<core::tier>(h.role()),
                  h.node_id(),
                  name,
                  backends,
                  h.memory_bytes(),
                  h.gflops(),
                  h.n_samples(),
                  h.protocol_version()};
  return make_hello(info);
}

message_builder make_welcome(const welcome_info& info) {
  message_builder b(128);
  b.finish(wire::CreateWelcome(b.fbb(), info.version, info.node_id, info.run_id, info.plan_epoch, info.heartbeat_ms,
                               info.per_device_replicas));
  return b;
}

message_builder make_plan(const plan_desc& p) {
  message_builder b(p.model_json.size() + 1024);
  auto& f = b.fbb();
  std::vector<flatbuffers::Offset<wire::StageAssignment>> stages;
  for (int s = 0; s < p.route.n_segments(); ++s) {
    const core::tier t = p.route.path[static_cast<std::size_t>(s)];
    const std::uint32_t node = t == core::tier::device ? p.device_id : t == core::tier::edge ? p.edge_id : 0;
    stages.push_back(wire::CreateStageAssignment(f, node, role_of(t), static_cast<std::uint32_t>(p.route.begin(s)),
                                                 static_cast<std::uint32_t>(p.route.end(s)),
                                                 s + 1 == p.route.n_segments()));
  }
  flatbuffers::Offset<flatbuffers::Vector<std::uint8_t>> hops;
  if (!p.hops.empty()) {
    CLEAVE_ASSERT(p.hops.size() + 1 == p.route.path.size(), "one codec pair per hop of the route");
    std::vector<std::uint8_t> h;
    for (const auto& c : p.hops) {
      h.push_back(static_cast<std::uint8_t>(c.up));
      h.push_back(static_cast<std::uint8_t>(c.down));
    }
    hops = f.CreateVector(h);
  }
  const auto dp = wire::CreateDevicePlan(f, p.device_id, f.CreateVector(stages), p.device_micro_batches,
                                         flatbuffers::Offset<flatbuffers::Vector<wire::Codec>>(hops.o));
  const auto model = f.CreateString(p.model_json.data(), p.model_json.size());
  const auto training = f.CreateString(core::to_json(p.training.opt));
  const auto devices = f.CreateVector(&dp, 1);
  b.finish(wire::CreatePlan(f, p.epoch, static_cast<std::uint32_t>(p.route.n_blocks), p.route.u_shape(), model,
                            p.micro_batch_size, p.n_micro_batches, devices, training, p.training.seed, p.resplit,
                            p.run_id, p.topk_fraction, p.stochastic_rounding, p.topk_feedback, p.secure_aggregation,
                            p.resume, f.CreateString(p.dataset.data(), p.dataset.size())));
  return b;
}

message_builder make_migrate(const migrate_desc& d, const split::route& to, const split::block_state& s) {
  const core::tier dest = split::tier_of_block(to, s.begin);
  std::vector<tensor_source> weights = {
      {core::dtype::f32, core::shape{static_cast<std::int64_t>(s.params.size())}, s.params.data(), "params"},
      {core::dtype::f32, core::shape{static_cast<std::int64_t>(s.buffers.size())}, s.buffers.data(), "buffers"}};
  std::vector<tensor_source> state;
  for (const auto& v : s.optimizer_state)
    state.push_back({core::dtype::f32, core::shape{static_cast<std::int64_t>(v.size())}, v.data(), "state"});
  const std::uint32_t to_node = dest == core::tier::device ? d.device_id : dest == core::tier::edge ? d.edge_id : 0;
  message_builder b(estimate_frame_bytes(weights) + estimate_frame_bytes(state));
  const auto w = b.add_tensors(weights);
  const auto o = b.add_tensors(state);
  b.finish(wire::CreateMigrate(b.fbb(), d.epoch, d.step, static_cast<std::uint32_t>(s.begin),
                               static_cast<std::uint32_t>(s.end), d.from_node, to_node, w, o, d.device_id,
                               role_of(d.from), role_of(dest), static_cast<std::uint64_t>(s.optimizer_steps)));
  return b;
}

message_builder make_cutover(std::uint32_t device_id, std::uint32_t epoch, std::uint64_t step) {
  message_builder b(96);
  b.finish(wire::CreateCutover(b.fbb(), device_id, epoch, step));
  return b;
}

split::block_state block_state_of(const wire::Migrate& m, const core::model_spec& model) {
  const auto n = static_cast<std::uint32_t>(model.n_blocks());
  if (m.first_block() >= m.end_block() || m.end_block() > n)
    throw core::error("Migrate of blocks [" + std::to_string(m.first_block()) + "," + std::to_string(m.end_block()) +
                      ") outside the model's " + std::to_string(n));
  if (m.optimizer_steps() > (1ULL << 40)) throw core::error("Migrate: optimizer step count out of range");
  const auto lay = core::layout_of(model);
  const auto np = lay.param_offset[m.end_block()] - lay.param_offset[m.first_block()];
  const auto nb = lay.buffer_offset[m.end_block()] - lay.buffer_offset[m.first_block()];
  split::block_state s;
  s.begin = static_cast<int>(m.first_block());
  s.end = static_cast<int>(m.end_block());
  const auto p = f32_tensor(m.weights(), "params", np, "Migrate");
  const auto b = f32_tensor(m.weights(), "buffers", nb, "Migrate");
  s.params.assign(p.begin(), p.end());
  s.buffers.assign(b.begin(), b.end());
  if (m.optimizer_state()) {
    if (m.optimizer_state()->size() > 2) throw core::error("Migrate: more than two optimizer state tensors");
    for (const auto* t : *m.optimizer_state()) {
      const tensor_view v = view_of(*t);
      if (v.dtype != core::dtype::f32 || v.numel() != np)
        throw core::error("Migrate: optimizer state holds " + std::to_string(v.numel()) + " " +
                          std::string(core::dtype_name(v.dtype)) + " values, expected " + std::to_string(np) + " f32");
      const auto vals = v.values<float>();
      s.optimizer_state.emplace_back(vals.begin(), vals.end());
    }
  }
  s.optimizer_steps = static_cast<std::int64_t>(m.optimizer_steps());
  return s;
}

core::tier tier_of(wire::Role r) {
  return static_cast<core::tier>(r);
}

training_settings training_of(const wire::Plan& p) {
  training_settings t;
  if (!p.training()) throw core::error("plan without training settings");
  t.opt = core::optimizer_config_from_json(p.training()->str());
  t.seed = p.seed();
  return t;
}

split::route route_for(const wire::Plan& p, std::uint32_t device, int n_blocks) {
  if (static_cast<int>(p.n_blocks()) != n_blocks)
    throw core::error("plan for " + std::to_string(p.n_blocks()) + " blocks, the model has " +
                      std::to_string(n_blocks));
  if (p.devices())
    for (const auto* d : *p.devices()) {
      if (d->device_id() != device) continue;
      if (!d->stages() || d->stages()->size() < 2)
        throw core::error("plan of device " + std::to_string(device) + " has fewer than two stages");
      bool edge = false;
      std::vector<int> cuts;
      const auto& st = *d->stages();
      for (flatbuffers::uoffset_t i = 0; i < st.size(); ++i) {
        if (st.Get(i)->role() == wire::Role::edge) edge = true;
        if (i + 1 < st.size()) cuts.push_back(static_cast<int>(st.Get(i)->end_block()));
      }
      const bool u = st.Get(st.size() - 1)->role() == wire::Role::device;
      split::route r = split::make_route(u, edge, cuts, n_blocks);
      for (flatbuffers::uoffset_t i = 0; i < st.size(); ++i)
        if (st.Get(i)->role() != role_of(r.path[i]) ||
            st.Get(i)->first_block() != static_cast<std::uint32_t>(r.begin(static_cast<int>(i))) ||
            st.Get(i)->end_block() != static_cast<std::uint32_t>(r.end(static_cast<int>(i))))
          throw core::error("plan of device " + std::to_string(device) + ": stage " + std::to_string(i) +
                            " does not fit a " + r.str() + " route");
      return r;
    }
  throw core::error("plan has no route for device " + std::to_string(device));
}

cut_settings cut_settings_for(const wire::Plan& p, std::uint32_t device, const split::route& r) {
  cut_settings c;
  c.n_micro_batches = std::max(1u, p.n_micro_batches());
  c.topk_fraction = p.topk_fraction() > 0 ? p.topk_fraction() : 0.1f;
  c.stochastic_rounding = p.stochastic_rounding();
  c.topk_feedback = p.topk_feedback();
  c.hops.assign(r.path.size() - 1, core::hop_codecs{});
  if (!p.devices()) return c;
  for (const auto* d : *p.devices()) {
    if (d->device_id() != device) continue;
    if (d->n_micro_batches()) c.n_micro_batches = d->n_micro_batches();
    if (const auto* h = d->hop_codecs()) {
      if (h->size() != 2 * c.hops.size())
        throw core::error("plan of device " + std::to_string(device) + ": " + std::to_string(h->size()) +
                          " hop codecs for the " + std::to_string(c.hops.size()) + " hops of route " + r.str());
      for (std::size_t k = 0; k < c.hops.size(); ++k)  // values checked by the validator
        c.hops[k] = {static_cast<core::codec>(h->Get(static_cast<flatbuffers::uoffset_t>(2 * k))),
                     static_cast<core::codec>(h->Get(static_cast<flatbuffers::uoffset_t>(2 * k + 1)))};
    }
  }
  return c;
}

void cut_settings::keep_output_exact(const split::route& r) {
  hops = split::exact_output(r, std::move(hops));
}

core::codec_spec cut_settings::spec(int hop, bool up, std::uint32_t seed) const {
  core::codec_spec s;
  if (hop >= 0 && hop < static_cast<int>(hops.size())) {
    const auto& h = hops[static_cast<std::size_t>(hop)];
    s.id = up ? h.up : h.down;
  }
  s.topk_fraction = topk_fraction;
  s.stochastic = stochastic_rounding;
  s.seed = seed;
  return s;
}

batch_info batch_of(const wire::Activations& a) {
  batch_info b{a.batch_size(), a.n_micro_batches()};
  if (b.batch_size == 0) {
    // A sender that does not micro-batch: the activation is the whole batch.
    const auto* s = a.activation()->shape();
    b.batch_size = static_cast<std::uint32_t>(s && s->size() ? s->Get(0) : 1);
    b.n_micro_batches = 1;
  }
  return b;
}

namespace {

// The one writer of each step message's table, whatever memory its tensors came from.
void finish_activations(message_builder& m, const step_key& key, const batch_info& batch,
                        flatbuffers::Offset<wire::Tensor> a, flatbuffers::Offset<wire::Tensor> labels) {
  m.finish(wire::CreateActivations(m.fbb(), key.epoch, key.step, key.micro_batch, key.device_id, key.block, a, labels,
                                   batch.batch_size, batch.n_micro_batches, key.attempt));
}

void finish_gradients(message_builder& m, const step_key& key, flatbuffers::Offset<wire::Tensor> g, float loss,
                      std::uint32_t n_correct) {
  m.finish(wire::CreateGradients(m.fbb(), key.epoch, key.step, key.micro_batch, key.device_id, key.block, g, loss,
                                 n_correct, key.attempt));
}

// A host tensor, encoded by spec where it is not f32 (then its values are f32).
flatbuffers::Offset<wire::Tensor> add_host_tensor(message_builder& m, const tensor_source& t,
                                                  const core::codec_spec& spec) {
  if (spec.id == core::codec::f32) return m.add_tensor(t);
  CLEAVE_ASSERT(t.dtype == core::dtype::f32, "an encoded tensor holds f32 values");
  return m.add_encoded_tensor(spec, t.shape, t.name, static_cast<const float*>(t.data), nullptr);
}

}  // namespace

std::optional<step_key> step_key_of(const message& m) {
  if (const auto* a = m.as<wire::Activations>())
    return step_key{a->epoch(), a->step(), a->micro_batch(), a->device_id(), a->block(), a->attempt()};
  if (const auto* g = m.as<wire::Gradients>())
    return step_key{g->epoch(), g->step(), g->micro_batch(), g->device_id(), g->block(), g->attempt()};
  return std::nullopt;
}

message_builder make_activations(const step_key& key, const batch_info& batch, core::backend& b,
                                 const core::tensor& activation, const core::tensor* labels,
                                 const core::codec_spec& codec) {
  message_builder m(activation.bytes() + (labels ? labels->bytes() : 0) + 512);
  const auto a = add_tensor(m, b, activation, "activation", codec);
  flatbuffers::Offset<wire::Tensor> l;
  if (labels) l = add_tensor(m, b, *labels, "labels");
  finish_activations(m, key, batch, a, l);
  return m;
}

message_builder make_activations(const step_key& key, const batch_info& batch, const tensor_source& activation,
                                 const tensor_source* labels, const core::codec_spec& codec) {
  const tensor_source both[2] = {activation, labels ? *labels : tensor_source{}};
  message_builder m(estimate_frame_bytes(std::span(both, labels ? 2 : 1)));
  const auto a = add_host_tensor(m, activation, codec);
  flatbuffers::Offset<wire::Tensor> l;
  if (labels) l = m.add_tensor(*labels);
  finish_activations(m, key, batch, a, l);
  return m;
}

message_builder make_gradients(const step_key& key, core::backend& b, const core::tensor& gradient, float loss,
                               std::uint32_t n_correct, const core::codec_spec& codec, std::vector<float>* residual) {
  message_builder m(gradient.bytes() + 512);
  const auto g = add_tensor(m, b, gradient, "gradient", codec, residual);
  finish_gradients(m, key, g, loss, n_correct);
  return m;
}

message_builder make_gradients(const step_key& key, const tensor_source& gradient, float loss, std::uint32_t n_correct,
                               const core::codec_spec& codec) {
  message_builder m(estimate_frame_bytes(std::span(&gradient, 1)));
  const auto g = add_host_tensor(m, gradient, codec);
  finish_gradients(m, key, g, loss, n_correct);
  return m;
}

message_builder make_round_start(const round_start_desc& r) {
  message_builder m(256 + r.devices.size() * 4);
  const auto devices = m.fbb().CreateVector(r.devices.data(), r.devices.size());
  m.finish(wire::CreateRoundStart(m.fbb(), r.round, r.epoch, r.local_steps, r.deadline_ms, r.learning_rate, r.device_id,
                                  devices, r.attempt));
  return m;
}

round_stats stats_of(const wire::ReplicaUpload& r) {
  return {r.compute_us(), r.device_compute_us(), r.bytes_moved(), r.loss_sum(), r.n_loss(), r.n_correct()};
}

namespace {

template <class AddWeights>
message_builder replica_message(const replica_desc& d, std::size_t bytes, AddWeights add) {
  message_builder m(bytes + 512 + d.devices.size() * 4);
  auto& f = m.fbb();
  // A part without blocks carries only statistics.
  const auto weights = d.first_block == d.end_block
                           ? flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::Tensor>>>()
                           : add(m);
  const auto devices = f.CreateVector(d.devices.data(), d.devices.size());
  m.finish(wire::CreateReplicaUpload(f, d.round, d.node_id, d.first_block, d.end_block, d.n_samples, weights, devices,
                                     d.final_part, d.stats.compute_us, d.stats.device_compute_us, d.stats.bytes_moved,
                                     d.stats.loss_sum, d.stats.n_loss, d.stats.n_correct, d.attempt));
  return m;
}

}  // namespace

message_builder make_replica_upload(const replica_desc& d, core::backend& b, const core::tensor& params,
                                    const core::tensor& buffers) {
  return replica_message(d, params.bytes() + buffers.bytes(), [&](message_builder& m) {
    flatbuffers::Offset<wire::Tensor> t[2] = {add_tensor(m, b, params, "params"), add_tensor(m, b, buffers, "buffers")};
    return m.fbb().CreateVector(t, 2);
  });
}

message_builder make_replica_upload(const replica_desc& d, std::span<const float> params,
                                    std::span<const float> buffers) {
  return replica_message(d, (params.size() + buffers.size()) * 4, [&](message_builder& m) {
    const tensor_source src[2] = {
        {core::dtype::f32, core::shape{static_cast<std::int64_t>(params.size())}, params.data(), "params"},
        {core::dtype::f32, core::shape{static_cast<std::int64_t>(buffers.size())}, buffers.data(), "buffers"}};
    return m.add_tensors(src);
  });
}

std::vector<std::uint32_t> devices_of(const wire::ReplicaUpload& r) {
  std::vector<std::uint32_t> out;
  if (r.devices()) out.assign(r.devices()->begin(), r.devices()->end());
  return out;
}

weights_view replica_weights_of(const wire::ReplicaUpload& r, const core::model_spec& m) {
  // A part without weights: statistics only (an edge's, or a device's under secure aggregation).
  if (r.first_block() == r.end_block() && (!r.weights() || r.weights()->size() == 0)) return {};
  if (r.first_block() >= r.end_block() || r.end_block() > static_cast<std::uint32_t>(m.n_blocks()))
    throw core::error("replica of blocks [" + std::to_string(r.first_block()) + "," + std::to_string(r.end_block()) +
                      ") outside the model's " + std::to_string(m.n_blocks()));
  const auto lay = core::layout_of(m);
  const auto np = lay.param_offset[r.end_block()] - lay.param_offset[r.first_block()];
  const auto nb = lay.buffer_offset[r.end_block()] - lay.buffer_offset[r.first_block()];
  return {f32_tensor(r.weights(), "params", np, "replica"), f32_tensor(r.weights(), "buffers", nb, "replica")};
}

message_builder make_global_weights(const global_weights_desc& d, std::span<const float> params,
                                    std::span<const float> buffers) {
  message_builder m((params.size() + buffers.size()) * 4 + 512);
  const tensor_source src[2] = {
      {core::dtype::f32, core::shape{static_cast<std::int64_t>(params.size())}, params.data(), "params"},
      {core::dtype::f32, core::shape{static_cast<std::int64_t>(buffers.size())}, buffers.data(), "buffers"}};
  const auto w = m.add_tensors(src);
  m.finish(wire::CreateGlobalWeights(m.fbb(), d.round, 0, d.n_blocks, w, d.device_id, d.test_accuracy, d.test_loss));
  return m;
}

weights_view weights_of(const wire::GlobalWeights& g, const core::model_spec& m) {
  const auto lay = core::layout_of(m);
  return {f32_tensor(g.weights(), "params", lay.param_offset.back(), "global weights"),
          f32_tensor(g.weights(), "buffers", lay.buffer_offset.back(), "global weights")};
}

void install(core::stage& s, std::span<const float> params, std::span<const float> buffers) {
  const auto lay = core::layout_of(s.model());
  const auto p0 = lay.param_offset[static_cast<std::size_t>(s.begin())];
  const auto b0 = lay.buffer_offset[static_cast<std::size_t>(s.begin())];
  CLEAVE_ASSERT(static_cast<std::int64_t>(params.size()) == lay.param_offset.back() &&
                    static_cast<std::int64_t>(buffers.size()) == lay.buffer_offset.back(),
                "install needs whole-model vectors");
  if (s.n_params()) s.device().upload(s.params(), params.data() + p0);
  if (s.n_buffers()) s.device().upload(s.buffers(), buffers.data() + b0);
}

message_builder make_leave(const leave_desc& l) {
  message_builder m(128 + l.reason.size());
  const auto reason = m.fbb().CreateString(l.reason.data(), l.reason.size());
  m.finish(wire::CreateLeave(m.fbb(), l.node_id, reason));
  return m;
}

message_builder make_revocations(std::span<const std::uint8_t> crl) {
  message_builder m(128 + crl.size());
  const auto v = m.fbb().CreateVector(crl.data(), crl.size());
  m.finish(wire::CreateRevocations(m.fbb(), v));
  return m;
}

message_builder make_admin_request(const admin_request& r) {
  message_builder m(256 + r.action.size() + r.text.size() + r.data.size());
  auto& f = m.fbb();
  const auto action = f.CreateString(r.action);
  const auto text = f.CreateString(r.text);
  const auto data = f.CreateVector(r.data);
  m.finish(wire::CreateAdminRequest(f, action, r.job, text, data, r.offset));
  return m;
}

message_builder make_admin_reply(const admin_reply& r) {
  message_builder m(256 + r.text.size() + r.data.size());
  auto& f = m.fbb();
  const auto text = f.CreateString(r.text);
  const auto data = f.CreateVector(r.data);
  m.finish(wire::CreateAdminReply(f, r.ok, text, data, r.offset, r.done, r.job));
  return m;
}

namespace {
std::vector<std::uint8_t> bytes_of(const flatbuffers::Vector<std::uint8_t>* v) {
  return v ? std::vector<std::uint8_t>(v->begin(), v->end()) : std::vector<std::uint8_t>{};
}
std::string text_of(const flatbuffers::String* s) {
  return s ? s->str() : std::string();
}
}  // namespace

admin_request admin_request_of(const wire::AdminRequest& m) {
  return {text_of(m.action()), m.job(), text_of(m.text()), bytes_of(m.data()), m.offset()};
}

admin_reply admin_reply_of(const wire::AdminReply& m) {
  return {m.ok(), text_of(m.text()), bytes_of(m.data()), m.offset(), m.done(), m.job()};
}

message_builder make_secagg(const secagg_desc& d) {
  std::size_t bytes =
      256 + d.words.size() * 8 + (d.devices.size() + d.dropped.size() + d.blocks.size()) * 4 + d.keys.size() * 96;
  for (const auto& k : d.keys) bytes += k.certificate.size() + k.signature.size() + 16;
  for (const auto& b : d.blobs) bytes += b.bytes.size() + 32;
  message_builder m(bytes);
  auto& f = m.fbb();
  std::vector<flatbuffers::Offset<wire::SecAggKey>> keys;
  for (const auto& k : d.keys)
    keys.push_back(wire::CreateSecAggKey(f, k.id, f.CreateVector(k.mask_public.data(), k.mask_public.size()),
                                         f.CreateVector(k.encrypt_public.data(), k.encrypt_public.size()),
                                         f.CreateVector(k.certificate), f.CreateVector(k.signature)));
  std::vector<flatbuffers::Offset<wire::SecAggBlob>> blobs;
  for (const auto& b : d.blobs) blobs.push_back(wire::CreateSecAggBlob(f, b.id, f.CreateVector(b.bytes)));
  const auto list = [&f](std::span<const std::uint32_t> v) { return f.CreateVector(v.data(), v.size()); };
  const auto devices = list(d.devices), dropped = list(d.dropped), blocks = list(d.blocks);
  const auto words = f.CreateVector(d.words.data(), d.words.size());
  m.finish(wire::CreateSecAgg(f, d.phase, d.round, d.device_id, f.CreateVector(keys), d.threshold,
                              f.CreateVector(blobs), devices, dropped, blocks, words));
  return m;
}

std::vector<privacy::roster_entry> keys_of(const wire::SecAgg& m) {
  std::vector<privacy::roster_entry> out;
  if (!m.keys()) return out;
  for (const auto* k : *m.keys()) {
    privacy::roster_entry e;
    e.id = k->device_id();
    if (!k->mask_public() || !k->encrypt_public() || k->mask_public()->size() != 32 ||
        k->encrypt_public()->size() != 32)
      throw core::error("secure aggregation key of device " + std::to_string(e.id) + " is not 32 bytes");
    std::memcpy(e.mask_public.data(), k->mask_public()->data(), 32);
    std::memcpy(e.encrypt_public.data(), k->encrypt_public()->data(), 32);
    if (k->certificate()) e.certificate.assign(k->certificate()->begin(), k->certificate()->end());
    if (k->signature()) e.signature.assign(k->signature()->begin(), k->signature()->end());
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<privacy::addressed> blobs_of(const wire::SecAgg& m) {
  std::vector<privacy::addressed> out;
  if (m.blobs())
    for (const auto* b : *m.blobs()) {
      privacy::addressed a;
      a.id = b->device_id();
      if (b->data()) a.bytes.assign(b->data()->begin(), b->data()->end());
      out.push_back(std::move(a));
    }
  return out;
}

std::vector<std::uint32_t> ids_of(const flatbuffers::Vector<std::uint32_t>* v) {
  if (!v) return {};
  return {v->begin(), v->end()};
}

std::vector<std::pair<int, int>> block_ranges_of(const wire::SecAgg& m, int n_blocks) {
  std::vector<std::pair<int, int>> out;
  const auto b = ids_of(m.blocks());
  if (b.size() % 2) throw core::error("mask set: an odd number of block bounds");
  for (std::size_t i = 0; i < b.size(); i += 2) {
    const int first = static_cast<int>(b[i]), end = static_cast<int>(b[i + 1]);
    if (!(first < end && end <= n_blocks) || (!out.empty() && first < out.back().second))
      throw core::error("mask set: block range [" + std::to_string(first) + ", " + std::to_string(end) +
                        ") is empty, overlaps the one before or lies beyond the model's " + std::to_string(n_blocks) +
                        " blocks");
    out.emplace_back(first, end);
  }
  return out;
}

message_builder copy_of(const message& m) {
  return message_builder::from_frame(m.frame());
}

message_builder make_profile(const split::node_profile& p, std::uint32_t epoch, std::uint64_t step) {
  message_builder m(256 + p.blocks.size() * 64 + p.links.size() * 48);
  auto& f = m.fbb();
  std::vector<flatbuffers::Offset<wire::BlockProfile>> blocks;
  blocks.reserve(p.blocks.size());
  for (std::size_t i = 0; i < p.blocks.size(); ++i) {
    const split::block_profile& b = p.blocks[i];
    blocks.push_back(wire::CreateBlockProfile(
        f, static_cast<std::uint32_t>(i), static_cast<float>(b.forward_seconds * 1e6),
        static_cast<float>(b.backward_seconds * 1e6), b.param_bytes, b.output_bytes, b.state_bytes, b.saved_bytes));
  }
  const auto bl = f.CreateVector(blocks);
  std::vector<flatbuffers::Offset<wire::LinkProfile>> links;
  for (const auto& l : p.links)
    links.push_back(wire::CreateLinkProfile(f, l.peer_id, l.rtt_us, l.bandwidth_bytes_per_s));
  const auto ll = f.CreateVector(links);
  const auto be = f.CreateString(p.backend.data(), p.backend.size());
  m.finish(wire::CreateProfile(f, p.node_id, epoch, step, p.memory_budget_bytes, bl, ll, p.batch, be));
  return m;
}

split::node_profile profile_of(const wire::Profile& p, int n_blocks) {
  const std::string what = "profile from node " + std::to_string(p.node_id());
  const auto n = p.blocks() ? static_cast<int>(p.blocks()->size()) : 0;
  if (n != n_blocks)
    throw core::error(what + ": " + std::to_string(n) + " block profiles for a model of " + std::to_string(n_blocks) +
                      " blocks");
  split::node_profile out;
  out.node_id = p.node_id();
  out.batch = p.batch();
  out.backend = p.backend() ? p.backend()->str() : std::string();
  out.memory_budget_bytes = p.memory_budget_bytes();
  out.blocks.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const wire::BlockProfile& b = *p.blocks()->Get(static_cast<flatbuffers::uoffset_t>(i));
    if (b.block() != static_cast<std::uint32_t>(i))
      throw core::error(what + ": entry " + std::to_string(i) + " profiles block " + std::to_string(b.block()) +
                        " (expected blocks in order from 0)");
    for (const auto& [t, name] : {std::pair{b.forward_us(), "forward"}, std::pair{b.backward_us(), "backward"}})
      if (!std::isfinite(t) || t < 0)
        throw core::error(what + ": block " + std::to_string(i) + ": " + name + " time " + std::to_string(t) +
                          " us is not a finite, non-negative value");
    split::block_profile bp;
    bp.forward_seconds = static_cast<double>(b.forward_us()) * 1e-6;
    bp.backward_seconds = static_cast<double>(b.backward_us()) * 1e-6;
    bp.param_bytes = b.memory_bytes();
    bp.state_bytes = b.state_bytes();
    bp.saved_bytes = b.saved_bytes();
    bp.output_bytes = b.output_bytes();
    out.blocks.push_back(bp);
  }
  if (p.links())
    for (const auto* l : *p.links()) {
      if (!std::isfinite(l->rtt_us()) || l->rtt_us() < 0 || !std::isfinite(l->bandwidth_bytes_per_s()) ||
          l->bandwidth_bytes_per_s() < 0)
        throw core::error(what + ": link to node " + std::to_string(l->peer_id()) +
                          ": round-trip time or bandwidth is not a finite, non-negative value");
      out.links.push_back({l->peer_id(), l->rtt_us(), l->bandwidth_bytes_per_s()});
    }
  return out;
}

}  // namespace cleave::protocol
