// The device agent: owns a data shard and the device's segments of the model (the bottom, and
// in U-shape also the top with the loss), connects to its edge or server over TLS, trains the
// rounds it is given, uploads its replicas, installs the global weights, and reconnects when
// the link drops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cleave/core/dataset.h"
#include "cleave/core/partition.h"
#include "cleave/privacy/cut_filters.h"
#include "cleave/runtime/node_config.h"
#include "cleave/runtime/segment_runner.h"

namespace cleave::device {

// The check of the gradients that come back through the bottom cut (agent_config).
enum class gradient_check_mode : std::uint8_t { off, warn, refuse };

struct agent_config : runtime::node_config {  // name: e.g. "device-1"
  std::uint32_t id = 0;                       // device id, unique in the federation (> 0; must be set)
  std::string upstream_host = "127.0.0.1";
  std::uint16_t upstream_port = 7000;
  std::string upstream_name;  // required certificate name of the upstream node ("" = any the CA signed)
  // The role the upstream's certificate must hold. Unset: a server when no name is pinned, a
  // server or an edge when upstream_name pins one. Never a device.
  std::optional<core::tier> upstream_role;
  // The training data: a data set by name or directory (core::load_dataset), unless `source` is
  // set, an app's own samples (a sensor, a camera); the shard below is picked from its labels
  // the same way either way.
  std::string data = "fashion-mnist";
  // The name this device's data set goes by in jobs ("": `data` itself): a plan naming another
  // data set is refused, unless `offers` holds it ("NAME=DIR", more data sets this device trains
  // on): with `stay`, the agent then ends this run to be started again on that one
  // (data_set_wanted()).
  std::string data_name;
  std::vector<std::string> offers;
  std::shared_ptr<const core::data_source> source;
  // Which part of the training set this device holds: shard `shard` of `n_shards` under
  // `partition`, drawn with `partition_seed`.
  int n_shards = 1;
  int shard = 0;
  core::partition_spec partition;
  std::uint64_t partition_seed = 1;
  // Seed of this device's data order (default: derived from the partition seed and the id).
  std::uint64_t order_seed = 0;
  // Augmentation of the batches this device trains on, drawn with the order seed (each sample's
  // index in the shard and its pass over the shard).
  core::augment_config augment;
  // Compute made this many times slower (sleeping in proportion to measured compute time),
  // to emulate a weaker board.
  double slowdown = 1.0;
  // The device's own policy, whatever the server plans (a refused plan or global model is an
  // Error to the server; the agent stays up): the model specs it trains, by the SHA-256 of their
  // JSON (empty: any), and the blocks every route keeps on it at least. A route whose blocks on
  // the device hold no parameters (the input only reshaped or pooled) is always refused, and so
  // are global weights that are not finite.
  std::vector<std::string> allowed_models;
  int min_device_blocks = 0;
  // Uploads its replicas only masked for secure aggregation (privacy/secagg.h): a server whose
  // plan does not aggregate securely is refused. Without it the device follows the server's plan.
  bool secure_aggregation = false;
  // A roster (secure aggregation's members of a round) is taken only with at least this many
  // devices (>= 2), a threshold above half of them, and every member a device of the federation
  // that signed its keys (protocol/signed_keys.h).
  int secagg_min_roster = 3;
  // In U-shaped plans (the loss here): Gaussian noise on the gradients this device sends up at its
  // top cut, s^2 times each sample's gap to the batch's largest squared norm (s = 1: max-norm), so
  // that the server cannot tell labels by gradient norm or direction (privacy::label_noise_filter).
  // Negative: off.
  double cut_gradient_noise = -1;
  // In U-shaped plans: every gradient this device sends up at its top cut is rescaled, sample by
  // sample, to the micro-batch's root-mean-square norm, so their norms tell the server nothing
  // (privacy::label_equalise_filter). Applied before cut_gradient_noise, which then adds
  // nothing: every gap to the largest norm is 0.
  bool equalise_cut_gradients = false;
  // Defences of the activations this device sends up at its bottom cut
  // (privacy::clip_filter, privacy::nopeek_filter): each sample's activation clipped to L2 norm `activation_clip`,
  // then Gaussian noise of std activation_noise * activation_clip per value, with the privacy it
  // gives (epsilon at `dp_delta` per input sample, Renyi DP) logged every round; `nopeek` > 0:
  // the weight of the distance correlation of inputs and activations in the device's loss. 0: off.
  double activation_clip = 0;
  double activation_noise = 0;
  double dp_delta = 1e-5;
  double nopeek = 0;
  // The check of the gradients that come back through the bottom cut: off, warn (a warning
  // when their label alignment over the last `gradient_check_window` micro-batches falls below
  // `gradient_check_threshold`: the server may be steering the device's features rather than
  // training on its labels), or refuse (the device stops training with that server).
  gradient_check_mode gradient_check = gradient_check_mode::warn;
  int gradient_check_window = 64;
  double gradient_check_threshold = 0.1;
  int profile_every = 20;  // steps between the profiles sent upstream
  // Devices of one process standing for one kind of board (virtual devices) share their block
  // profiles and the cores (see runtime::shared_board). Unset: a board of its own.
  std::shared_ptr<runtime::shared_board> shared_board;
  // Sees every frame this device sends (tests of what leaves the device).
  std::function<void(std::span<const std::byte> frame)> on_send;
  // Sees every round this device finished (with its mean loss, NaN where none came back) and
  // every global model it installed (with the round that model comes from).
  std::function<void(std::uint64_t round, double loss)> on_round;
  std::function<void(std::uint64_t round)> on_weights;
  // For tests of hostile devices only: may change the values of every replica this device
  // uploads (a segment's flat parameters and state) just before they are encoded.
  std::function<void(std::vector<float>& params, std::vector<float>& buffers)> on_upload;
  // For tests of hostile servers only: may change every gradient that comes back through the
  // bottom cut (privacy::gradient_hook_filter).
  privacy::gradient_hook on_gradient;
};

class agent {
 public:
  explicit agent(agent_config c);
  ~agent();
  agent(const agent&) = delete;
  agent& operator=(const agent&) = delete;

  // Trains until the server ends the run or the process is told to stop (stop(), SIGINT or
  // SIGTERM with stop_on_signals); returns 0, or throws core::error on a fatal configuration
  // problem (data, certificates, backend, a model its data does not fit).
  int run();
  // Thread-safe: ends run() soon.
  void stop();
  // SIGINT and SIGTERM end run() cleanly; SIGHUP reloads the certificate, key, CA and revocation
  // list for new connections, closing those of peers now revoked (call before run()).
  void stop_on_signals();
  // After run(): the offered data set ("NAME=DIR") a job wanted instead of the one held, if
  // that ended the run; "" otherwise.
  std::string data_set_wanted() const;

 private:
  class impl;
  std::unique_ptr<impl> impl_;
};

// The data order seed a device uses by default: local training with this order seed reproduces
// the device's batches.
std::uint64_t default_order_seed(std::uint64_t partition_seed, std::uint32_t id);

}  // namespace cleave::device
