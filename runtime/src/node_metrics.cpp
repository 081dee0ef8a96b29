#include "cleave/runtime/node_metrics.h"

#include <string_view>

#include "cleave/backend/registry.h"
#include "cleave/core/build_info.h"

namespace cleave::runtime {

void set_build_info(metrics::registry& r) {
  const auto& b = core::this_build();
  r.set("cleave_build_info",
        {{"version", std::string(b.version)},
         {"commit", std::string(b.commit)},
         {"build_type", std::string(b.build_type)},
         {"backends", backend::compiled_backends(",")}},
        1);
}

namespace {

using metrics::kind;
struct family {
  const char* name;
  kind k;
  const char* help;
};
constexpr family catalogue[] = {
    {"cleave_build_info", kind::gauge, "This build (value 1): version, commit, build type, backends compiled in."},
    // Rounds and training.
    {"cleave_rounds_completed_total", kind::counter, "Rounds this node finished (the server: closed and averaged)."},
    {"cleave_round", kind::gauge, "The last round this node took part in."},
    {"cleave_steps_total", kind::counter, "Training steps this device ran."},
    {"cleave_train_loss", kind::gauge, "Mean training loss of the last round."},
    {"cleave_train_accuracy", kind::gauge, "Training accuracy of the last round (0-1)."},
    {"cleave_test_loss", kind::gauge, "Test loss of the global model at its last evaluation."},
    {"cleave_test_accuracy", kind::gauge, "Test accuracy of the global model at its last evaluation (0-1)."},
    {"cleave_evaluations_total", kind::counter, "Evaluations of the global model."},
    {"cleave_learning_rate", kind::gauge, "Learning rate of the last round."},
    {"cleave_compute_seconds_total", kind::counter,
     "Compute time of the model's blocks, by tier (the server reports every tier of its rounds)."},
    {"cleave_checkpoint_failures_total", kind::counter, "Checkpoint writes that failed."},
    {"cleave_secure_rounds_total", kind::counter, "Rounds whose device blocks were aggregated securely."},
    {"cleave_secure_blocks_withheld_total", kind::counter,
     "Device blocks kept at their global values because fewer than --secagg-min-holders devices held them."},
    {"cleave_secure_aggregation_failures_total", kind::counter,
     "Rounds whose secure aggregation failed (too few devices shared, uploaded or revealed)."},
    {"cleave_privacy_epsilon", kind::gauge,
     "Epsilon (Renyi DP, per input sample) of the noised activations this device sent: this round, and over the "
     "run."},
    {"cleave_cut_distance_correlation", kind::gauge,
     "Mean distance correlation of inputs and cut activations in the last round (NoPeek)."},
    {"cleave_gradient_label_alignment", kind::gauge,
     "Label alignment of the gradients that came back through the device's cut (recent micro-batches)."},
    {"cleave_gradient_check_alarms_total", kind::counter,
     "Rounds in which the gradients from upstream did not follow the device's labels."},
    // Devices and the split.
    {"cleave_devices_connected", kind::gauge, "Devices connected to this node (directly or through edges)."},
    {"cleave_devices_participating", kind::gauge, "Devices whose replicas the last round averaged."},
    {"cleave_step_seconds", kind::gauge, "Measured time of a training step in the last round."},
    {"cleave_predicted_step_seconds", kind::gauge, "The cost model's step time for the last round's devices."},
    {"cleave_device_predicted_step_seconds", kind::gauge,
     "The cost model's step time of a device in the last round (its plans in it)."},
    {"cleave_device_blocks", kind::gauge, "Blocks of a device's route on each tier."},
    {"cleave_resplits_total", kind::counter, "Re-splits (cut moves) this node made or took part in."},
    {"cleave_migration_seconds_total", kind::counter, "Time spent moving blocks at re-splits."},
    {"cleave_migrated_block_ranges_total", kind::counter, "Block ranges this node sent at re-splits."},
    {"cleave_migrated_bytes_total", kind::counter,
     "Bytes of the blocks (weights, optimizer state) this node sent at re-splits."},
    // Links.
    {"cleave_link_up", kind::gauge, "1 while the link to a peer is connected, else 0."},
    {"cleave_link_sent_bytes_total", kind::counter, "Bytes sent to a peer (frames, all connections)."},
    {"cleave_link_received_bytes_total", kind::counter, "Bytes received from a peer (frames, all connections)."},
    {"cleave_link_rtt_seconds", kind::gauge, "Round-trip time of the link to a peer (heartbeats)."},
    {"cleave_link_send_bandwidth_bytes_per_second", kind::gauge, "Measured send bandwidth to a peer."},
    {"cleave_link_receive_bandwidth_bytes_per_second", kind::gauge, "Measured receive bandwidth from a peer."},
    {"cleave_connections_total", kind::counter, "Connections this node made to its upstream."},
    {"cleave_refusals_total", kind::counter,
     "Peers or messages refused, by reason (revoked, hello, admission, message, upload, upstream, secagg)."},
    {"cleave_frames_dropped_total", kind::counter, "Messages dropped because the upstream link was down."},
    // The process.
    {"cleave_process_resident_memory_bytes", kind::gauge, "Resident set size of this process."},
    {"cleave_process_peak_resident_memory_bytes", kind::gauge, "Peak resident set size of this process."},
};

}  // namespace

void declare_node_metrics(metrics::registry& r) {
  for (const auto& f : catalogue) r.describe(f.name, f.k, f.help);
  // Counters are there at 0 from the start, so that a rate over them sees their first increments:
  // those without labels, and the labelled ones over the values they take (a link's by peer come
  // with its peer).
  const std::string_view by_tier = "cleave_compute_seconds_total", by_reason = "cleave_refusals_total";
  for (const auto& f : catalogue) {
    const std::string_view name = f.name;
    if (f.k != kind::counter || name.starts_with("cleave_link_")) continue;
    if (name == by_tier)
      for (const char* tier : {"device", "edge", "server"}) r.add(f.name, {{"tier", tier}}, 0);
    else if (name == by_reason)
      for (const char* why : {"revoked", "hello", "admission", "message", "upload", "upstream", "secagg"})
        r.add(f.name, {{"reason", why}}, 0);
    else
      r.add(f.name, {}, 0);
  }
}

void count_migration(metrics::registry& r,
                     const std::vector<std::pair<core::tier, transport::message_builder>>& moved) {
  double bytes = 0;
  for (const auto& [tier, msg] : moved) bytes += static_cast<double>(msg.frame().size());
  r.add("cleave_migrated_block_ranges_total", {}, static_cast<double>(moved.size()));
  r.add("cleave_migrated_bytes_total", {}, bytes);
}

void publish_link(metrics::registry& m, const std::string& peer, bool up, std::uint64_t sent, std::uint64_t received,
                  const transport::channel_stats& last) {
  const metrics::labels l{{"peer", peer}};
  m.set("cleave_link_up", l, up ? 1 : 0);
  m.raise_to("cleave_link_sent_bytes_total", l, static_cast<double>(sent));
  m.raise_to("cleave_link_received_bytes_total", l, static_cast<double>(received));
  if (!up) return;
  if (transport::link_rtt_us(last) > 0) m.set("cleave_link_rtt_seconds", l, transport::link_rtt_us(last) * 1e-6);
  if (last.send_bytes_per_second > 0)
    m.set("cleave_link_send_bandwidth_bytes_per_second", l, last.send_bytes_per_second);
  if (last.receive_bytes_per_second > 0)
    m.set("cleave_link_receive_bandwidth_bytes_per_second", l, last.receive_bytes_per_second);
}

}  // namespace cleave::runtime
