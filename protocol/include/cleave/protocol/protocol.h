// The training protocol: the one builder of every training message (Hello, Welcome, Plan,
// Activations, Gradients, RoundStart, ReplicaUpload, GlobalWeights, Profile, Migrate, Cutover,
// Leave, SecAgg) and its readers, between split/ and privacy/ values and the network layer's
// messages. Every reader checks what it reads against the model and throws core::error naming the
// problem. The fields are those of protocol/schema/wire.fbs.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cleave/core/codec.h"
#include "cleave/core/optimizer.h"
#include "cleave/core/stage.h"
#include "cleave/core/tier.h"
#include "cleave/privacy/secagg.h"
#include "cleave/split/pipeline.h"
#include "cleave/split/plan.h"
#include "cleave/split/profiler.h"
#include "cleave/transport/message.h"

namespace cleave::protocol {

// The network layer's envelope, which every builder here fills and every reader reads.
using transport::message;
using transport::message_builder;
using transport::tensor_source;

inline constexpr std::uint16_t protocol_version = static_cast<std::uint16_t>(wire::ProtocolVersion::v1);

// ---- joining ----
struct backend_desc {
  std::string_view name;
  float gflops = 0;
  std::uint64_t memory_bytes = 0;
};

struct hello_info {
  core::tier role = core::tier::device;
  std::uint32_t node_id = 0;
  std::string_view name;
  std::span<const backend_desc> backends;
  std::uint64_t memory_bytes = 0;
  float gflops = 0;
  std::uint64_t n_samples = 0;
  std::uint16_t version = protocol_version;
};
message_builder make_hello(const hello_info& info);
// Hello h as it was, named `name` (an edge relays a device's Hello under its certificate's name,
// not the one the device claims).
message_builder renamed_hello(const wire::Hello& h, std::string_view name);
// The role and node id of the Hello a channel must open with, checked against the peer's
// certificate (`identity`, the role and device id it binds, if any): this protocol version, the
// certificate's role, and for a device the id it binds. Throws core::error saying what is wrong.
std::pair<core::tier, std::uint32_t> admitted_hello(const transport::message& m, const std::string& identity,
                                                    std::optional<core::tier> cert_role,
                                                    std::optional<std::uint32_t> cert_id);

struct welcome_info {
  std::uint32_t node_id = 0;
  std::uint64_t run_id = 0;
  std::uint32_t plan_epoch = 0;
  std::uint32_t heartbeat_ms = 0;
  std::uint16_t version = protocol_version;
  bool per_device_replicas = false;  // to an edge: forward each device's replicas, no pre-average
};
message_builder make_welcome(const welcome_info& info);

// ---- plans ----
struct training_settings {
  core::optimizer_config opt;
  std::uint64_t seed = 1;
};

struct plan_desc {
  std::uint32_t epoch = 0;
  std::string_view model_json;
  training_settings training;
  std::uint32_t micro_batch_size = 0;
  std::uint32_t n_micro_batches = 1;
  std::uint32_t device_id = 0;
  std::uint32_t edge_id = 0;  // the edge on the route (if any)
  split::route route;
  bool resplit = false;  // applies at the device's next step boundary (see wire::Plan)
  std::uint64_t run_id = 0;
  std::uint32_t device_micro_batches = 0;  // 0: n_micro_batches
  std::vector<core::hop_codecs> hops;      // per hop of the route; empty: all f32
  float topk_fraction = 0.1f;
  bool stochastic_rounding = false;
  bool topk_feedback = false;
  bool secure_aggregation = false;  // device replicas go up masked (SecAgg), never in the clear
  bool resume = false;              // continues from the server's checkpoint (see wire::Plan)
  std::string_view dataset;         // the data set the devices train on ("": any)
};
// A plan for one device.
message_builder make_plan(const plan_desc& p);
training_settings training_of(const wire::Plan& p);
// The route of `device` in plan p, checked against the model's block count.
split::route route_for(const wire::Plan& p, std::uint32_t device, int n_blocks);
// How device's route r crosses its cuts under plan p: its micro-batches per step and per hop the
// codecs (all f32 where the plan names none). Throws core::error naming what does not fit r.
struct cut_settings {
  std::uint32_t n_micro_batches = 1;
  std::vector<core::hop_codecs> hops;
  float topk_fraction = 0.1f;
  bool stochastic_rounding = false;
  bool topk_feedback = false;

  // The codec spec of hop k in direction up (activations) or down (gradients).
  core::codec_spec spec(int hop, bool up, std::uint32_t seed) const;
  // The hop of r that carries the model's output and its gradient goes f32: they are small, and
  // every gradient of the step starts from the loss gradient (sparsifying it starves samples).
  // Segment runners apply the same rule to the route each step runs under.
  void keep_output_exact(const split::route& r);
};
cut_settings cut_settings_for(const wire::Plan& p, std::uint32_t device, const split::route& r);

// ---- re-splits ----
struct migrate_desc {
  std::uint32_t epoch = 0;  // the plan epoch the blocks belong to
  std::uint64_t step = 0;   // the first step of that epoch
  std::uint32_t device_id = 0;
  std::uint32_t edge_id = 0;  // the edge on the device's route (0: none)
  core::tier from = core::tier::device;
  std::uint32_t from_node = 0;  // the server is 0
};
// Blocks of a device's route with their weights and optimizer state, leaving tier d.from for
// the tier that runs them under the new route `to` (split::tier_of_block(to, s.begin)).
message_builder make_migrate(const migrate_desc& d, const split::route& to, const split::block_state& s);
// After the blocks of a re-split moved: device `device_id` runs plan `epoch` from `step` on.
message_builder make_cutover(std::uint32_t device_id, std::uint32_t epoch, std::uint64_t step);
// The state in a Migrate, checked against the model's layout (core::error naming the problem).
split::block_state block_state_of(const wire::Migrate& m, const core::model_spec& model);
core::tier tier_of(wire::Role r);

// ---- step messages ----
// Identifies one micro-batch crossing one cut: `block` is the first block after the cut.
struct step_key {
  std::uint32_t epoch = 0;
  std::uint64_t step = 0;
  std::uint32_t micro_batch = 0;
  std::uint32_t device_id = 0;
  std::uint32_t block = 0;
  std::uint32_t attempt = 1;  // at the step's round (see wire::RoundStart)
};
// The key of a step message (Activations or Gradients); nothing for any other message.
std::optional<step_key> step_key_of(const message& m);

// batch_size 0: a sender that does not micro-batch (the activation is the whole batch).
struct batch_info {
  std::uint32_t batch_size = 0;
  std::uint32_t n_micro_batches = 1;
};
batch_info batch_of(const wire::Activations& a);
// activation (B, ...) and, where the loss is computed above, labels (B) i32.
// The activation or gradient is encoded by `codec` (default f32: as computed); residual: topk's
// error feedback of this gradient stream.
message_builder make_activations(const step_key& key, const batch_info& batch, core::backend& b,
                                 const core::tensor& activation, const core::tensor* labels,
                                 const core::codec_spec& codec = {});
message_builder make_gradients(const step_key& key, core::backend& b, const core::tensor& gradient, float loss,
                               std::uint32_t n_correct, const core::codec_spec& codec = {},
                               std::vector<float>* residual = nullptr);
// The same messages from host memory (a tool, a test or a probe with no backend), tensors written
// as given (dtype, shape, name) and encoded by `codec` where it is not f32 (f32 values only).
message_builder make_activations(const step_key& key, const batch_info& batch, const tensor_source& activation,
                                 const tensor_source* labels = nullptr, const core::codec_spec& codec = {});
message_builder make_gradients(const step_key& key, const tensor_source& gradient, float loss = 0,
                               std::uint32_t n_correct = 0, const core::codec_spec& codec = {});

// ---- rounds ----
struct round_start_desc {
  std::uint64_t round = 0;
  std::uint32_t epoch = 0;
  std::uint32_t local_steps = 0;
  std::uint64_t deadline_ms = 0;
  float learning_rate = 0;
  std::uint32_t device_id = 0;
  std::span<const std::uint32_t> devices;
  std::uint32_t attempt = 1;  // a round nobody finished runs again (see wire::RoundStart)
};
message_builder make_round_start(const round_start_desc& r);

struct round_stats {
  std::uint64_t compute_us = 0;         // the sender's own compute
  std::uint64_t device_compute_us = 0;  // an edge: its devices' compute
  std::uint64_t bytes_moved = 0;        // an edge: bytes on its device channels
  double loss_sum = 0;                  // sum over samples of the loss computed by the sender's side
  std::uint64_t n_loss = 0, n_correct = 0;
};
round_stats stats_of(const wire::ReplicaUpload& r);

struct replica_desc {
  std::uint64_t round = 0;
  std::uint32_t node_id = 0;
  std::uint32_t first_block = 0, end_block = 0;
  std::uint64_t n_samples = 0;
  std::span<const std::uint32_t> devices;
  bool final_part = true;
  round_stats stats;
  std::uint32_t attempt = 1;  // the attempt at the round (see wire::RoundStart)
};
// A stage's replica (params (P) and buffers (S) tensors on b), or host vectors.
message_builder make_replica_upload(const replica_desc& d, core::backend& b, const core::tensor& params,
                                    const core::tensor& buffers);
message_builder make_replica_upload(const replica_desc& d, std::span<const float> params,
                                    std::span<const float> buffers);
std::vector<std::uint32_t> devices_of(const wire::ReplicaUpload& r);

// Flat f32 weights of blocks [first, end) inside a message, checked against the model layout.
struct weights_view {
  std::span<const float> params, buffers;
};
weights_view replica_weights_of(const wire::ReplicaUpload& r, const core::model_spec& m);

struct global_weights_desc {
  std::uint64_t round = 0;
  std::uint32_t n_blocks = 0;
  std::uint32_t device_id = 0;
  float test_accuracy = 0, test_loss = 0;
};
// The whole model's flat params and buffers.
message_builder make_global_weights(const global_weights_desc& d, std::span<const float> params,
                                    std::span<const float> buffers);
weights_view weights_of(const wire::GlobalWeights& g, const core::model_spec& m);
// Loads a stage's slice of whole-model flat vectors.
void install(core::stage& s, std::span<const float> params, std::span<const float> buffers);

// ---- membership ----
struct leave_desc {
  std::uint32_t node_id = 0;
  std::string_view reason;
};
message_builder make_leave(const leave_desc& l);
// The federation CA's revocation list (DER) for the tiers below.
message_builder make_revocations(std::span<const std::uint8_t> crl);

// ---- operators (a long-running server's jobs) ----
struct admin_request {
  std::string action;  // submit, list, status, logs, cancel, download
  std::uint64_t job = 0;
  std::string text;                // submit: the job file's name
  std::vector<std::uint8_t> data;  // submit: the job file
  std::uint64_t offset = 0;        // logs, download: from this byte
};
struct admin_reply {
  bool ok = false;
  std::string text;  // for the operator, or why the request failed
  std::vector<std::uint8_t> data;
  std::uint64_t offset = 0;
  bool done = true;  // logs, download: this piece is the file's last
  std::uint64_t job = 0;
};
message_builder make_admin_request(const admin_request& r);
message_builder make_admin_reply(const admin_reply& r);
admin_request admin_request_of(const wire::AdminRequest& m);
admin_reply admin_reply_of(const wire::AdminReply& m);

// A copy of a received message, to pass it on unchanged.
message_builder copy_of(const message& m);

// ---- secure aggregation (privacy/secagg.h) ----
struct secagg_desc {
  wire::SecAggPhase phase = wire::SecAggPhase::keys;
  std::uint64_t round = 0;
  std::uint32_t device_id = 0;  // up: the sender; down: the receiver
  std::span<const privacy::roster_entry> keys;
  std::uint32_t threshold = 0;
  std::span<const privacy::addressed> blobs;
  std::span<const std::uint32_t> devices, dropped;
  std::span<const std::uint32_t> blocks;  // [first, end) pairs
  std::span<const std::uint64_t> words;
};
message_builder make_secagg(const secagg_desc& d);
// The keys, blobs and id lists of a SecAgg message (the validator checked their sizes).
std::vector<privacy::roster_entry> keys_of(const wire::SecAgg& m);
std::vector<privacy::addressed> blobs_of(const wire::SecAgg& m);
std::vector<std::uint32_t> ids_of(const flatbuffers::Vector<std::uint32_t>* v);
// The [first, end) block pairs of a mask set, checked against the model's block count.
std::vector<std::pair<int, int>> block_ranges_of(const wire::SecAgg& m, int n_blocks);

// ---- profiles ----
// Times travel as microseconds (float); block_profile::state_bytes as the wire's state_bytes.
message_builder make_profile(const split::node_profile& p, std::uint32_t epoch, std::uint64_t step);
// Checked against the model: one profile per block of [0, n_blocks) in order, times finite and
// non-negative; throws core::error naming the node and the problem.
split::node_profile profile_of(const wire::Profile& p, int n_blocks);

}  // namespace cleave::protocol
