// The top tier: accepts devices (directly or through edge relays), gives each its plan, runs the
// server segments of every device route on its backend, drives the rounds (SplitFed-v1 or
// sequential split learning), averages all replicas every round, evaluates the global model on
// the test set and sends it back to every holder.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cleave/core/codec.h"
#include "cleave/core/data_source.h"
#include "cleave/core/model.h"
#include "cleave/core/optimizer.h"
#include "cleave/protocol/protocol.h"
#include "cleave/runtime/node_config.h"
#include "cleave/split/aggregator.h"
#include "cleave/split/plan.h"

namespace cleave::server {

enum class training_mode : std::uint8_t {
  splitfed,    // per-device server replicas, all devices in parallel, averaged each round
  sequential,  // one shared server replica, devices visited in turn
};

struct round_report {
  std::uint64_t round = 0;  // 1-based
  int n_devices = 0;        // in the average
  int n_participants = 0;   // asked to train
  double seconds = 0;
  double train_seconds = 0;  // from the round's start until every replica was in (no averaging)
  double train_loss = 0;     // mean over the round's samples
  double train_accuracy = 0;
  bool evaluated = false;                   // this round's global model was evaluated (--eval-every)
  double test_loss = 0, test_accuracy = 0;  // of the last evaluation (this round's when evaluated)
  std::int64_t test_samples = 0;            // the test samples it used
  double device_compute_s = 0, edge_compute_s = 0, server_compute_s = 0;  // summed over nodes
  std::uint64_t bytes_moved = 0;                                          // all channels, both ways
  double step_seconds = 0;                                                // measured: train_seconds / local steps
  double predicted_step_seconds = 0;  // the cost model's figure for the plan in force (0: no profiles yet)
  double learning_rate = 0;           // of this round
  int n_resplits = 0;                 // devices that switched plans during the round
  int secure_devices = 0;             // devices whose blocks were aggregated securely (0: none, or off)
  std::vector<std::pair<int, int>> secure_blocks;  // the device blocks decoded from their secure sum
  double planner_seconds = 0;         // the longest search for a plan during the round
  std::vector<std::pair<std::uint32_t, std::string>> routes;  // device -> its route at the round's end
  // Devices that re-split during the round: each plan their steps ran, in order, as the cost
  // model priced it for predicted_step_seconds.
  struct leg {
    std::uint32_t device = 0;
    std::string route;
    std::uint64_t steps = 0;
    double step_seconds = 0, migration_seconds = 0;
  };
  std::vector<leg> legs;
};

struct server_config : runtime::node_config {
  server_config() { name = "server"; }
  std::string listen_host = "127.0.0.1";
  std::uint16_t port = 7000;         // 0: any free port (see server_node::port())
  std::vector<std::string> allowed;  // certificate names allowed to connect ("" = any the CA signed)
  std::string model = "lenet5";
  // A model built in code (core::model_builder) instead of `model` (a zoo name or a spec file).
  std::optional<core::model_spec> model_spec;
  std::string data = "fashion-mnist";  // the test split evaluates the global model...
  // ...unless an app gives its own test samples here (a data_source of the devices' shape).
  std::shared_ptr<const core::data_source> test_source;
  training_mode mode = training_mode::splitfed;
  bool u_shape = false;
  std::vector<int> cuts;       // none: the default cuts; else e.g. {3} (2-tier), {3, 6} (3-tier)
  std::vector<int> edge_cuts;  // cuts for devices behind an edge (none: the default ones)
  int rounds = 5;
  int local_steps = 50;
  int batch = 64;
  int micro_batches = 1;
  // Codecs activations and gradients may cross the cut in (core/codec.h); every hop uses the
  // most compact allowed one per direction. f32 alone: the values as computed.
  core::codec_set codecs;
  int min_devices = 1;  // devices connected before every round starts
  double round_deadline_s = 120;
  double join_timeout_s = 120;        // waiting for min_devices: then log and keep waiting...
  bool exit_on_join_timeout = false;  // ...or end run() with an error
  std::uint64_t seed = 1;
  // How each block's replicas become the global block every round (split/aggregator.h): the
  // weighted mean, or a rule robust to a few hostile replicas. Every rule but the mean has the
  // edges forward each device's replicas instead of pre-averaging them.
  split::aggregate_rule aggregate;
  // Device replicas reach the server only as masked sums (privacy/secagg.h): it and the edges
  // learn the sum over a round's devices, never one device's blocks, and the sum survives
  // devices dropping out after masking. Needs the mean rule, splitfed mode and at least
  // secagg_min_holders devices.
  bool secure_aggregation = false;
  // Under secure aggregation a block's sum is decoded only over at least this many devices that
  // held it on the device that round (>= 2): a block fewer hold keeps its global value that round
  // (a sum over one device is that device's replica; adaptive splitting leaves devices with
  // unequal block sets).
  int secagg_min_holders = 3;
  // Blocks every device keeps at the bottom of its route at least: the initial cuts (default
  // ones are deepened to it, configured ones must respect it) and every re-split. Activations of
  // shallow cuts are the easiest to invert to the input.
  int min_device_blocks = 0;
  // Label groups G > 1 (core::with_label_groups): the model's last linear layer is widened to G
  // sub-classes per class and every step trains a randomly drawn one. In U-shaped plans the
  // gradients a device sends up then point at the sub-class about as much as at the class, which
  // defeats label inference by gradient direction against a known sample (Li et al.); the global
  // model is scored on its class logits. 1: the model as given.
  int label_groups = 1;
  // Optimizer settings of every replica. Its learning rate is the peak of a per-round schedule:
  // every node trains round r at lr_schedule's rate for step r - 1 of `rounds` (constant: opt.lr;
  // step: x0.1 after every third of the rounds; cosine: down towards 0), after warmup_rounds
  // rising linearly. opt itself carries no per-step schedule.
  core::optimizer_config opt;
  core::schedule_kind lr_schedule = core::schedule_kind::constant;
  int warmup_rounds = 0;
  // The global model saved after every round ("" = none), in the trainer's checkpoint format
  // (`cleave eval` and `cleave train --resume` read it). Its directory is checked at the start;
  // a write that fails later is logged, keeps the previous file, and training goes on.
  std::filesystem::path checkpoint;
  // A restarted server resumes from the newest readable checkpoint (written under the same
  // settings) at the next round; `fresh` starts over, and with a checkpoint there only with
  // `force` too. The previous keep_checkpoints are kept beside it (PATH.1 the newest).
  bool fresh = false, force = false;
  int keep_checkpoints = 2;
  // The global model is evaluated every eval_every rounds on eval_samples test samples (0: the
  // whole test split; else a fixed, seeded subset); the last round always on the whole split.
  int eval_every = 1;
  std::int64_t eval_samples = 0;
  // Training ends after the first round whose evaluated test accuracy (on the eval_samples subset
  // where set) is at least this, before `rounds` (0: never early). The learning-rate schedule
  // still spans `rounds`.
  double stop_at_accuracy = 0;
  // Adaptive splitting (splitfed mode): profiles -> cost model -> plan -> live re-split.
  bool adaptive = true;
  double min_gain = 0.10;         // relative step-time gain below which the plan is kept
  double repay_rounds = 2;        // a re-split must repay its migration within this many rounds
  std::filesystem::path run_log;  // one JSON object per round appended here; "" = none
  // "PORT" or "HOST:PORT" serving the live dashboard (a page, and its state as JSON at
  // /api/state); "" = none. Beyond loopback only with a token, which every request must then
  // carry (?token=TOKEN or Authorization: Bearer TOKEN); on loopback a token given is required too.
  std::string dashboard, dashboard_token;
  // The name of the data set the devices train on, sent in every plan: a device holding another
  // refuses the plan ("": whichever each holds).
  std::string dataset;
  // `cleave server --state DIR`: a long-running server (job_service) keeping its queue of jobs
  // there; `--job FILE`: one run of a job file. The node itself reads neither.
  std::filesystem::path state_dir, job_file;
  // A long-running server's jobs (job_service): requests of certificates of the admin role,
  // answered on the node's I/O thread. Unset: such certificates are refused.
  std::function<protocol::admin_reply(const protocol::admin_request&, const std::string& who)> on_admin;
  // ...and its jobs for the dashboard: a JSON array, one object per job (job_record's fields).
  std::function<std::string()> jobs_state;
  std::function<void(const round_report&)> on_round;
  std::function<void(std::uint64_t round, int n_participants)> on_round_start;
  std::function<void(std::uint16_t port)> on_listening;
  // Plans forced from outside (tests, benchmarks): asked at each new step of a device; a route
  // different from the current one is announced as a re-split (splitfed mode only).
  std::function<std::optional<split::route>(std::uint32_t device, std::uint64_t step, const split::route& current)>
      force_route;
};

class server_node {
 public:
  explicit server_node(server_config c);
  ~server_node();
  server_node(const server_node&) = delete;
  server_node& operator=(const server_node&) = delete;

  // Runs all rounds; returns the last round's report (round 0 when stopped before any). Throws
  // core::error on fatal problems (certificates, data, no devices joined in time).
  round_report run();
  void stop();  // thread-safe
  void stop(const std::string& why);  // thread-safe: the reason logged and sent to every node
  // SIGINT and SIGTERM end run() cleanly; SIGHUP reloads the certificate, key, CA and revocation
  // list for new connections, closing those of peers now revoked (call before run()).
  void stop_on_signals();

  // Why the last checkpoint write that failed did ("" when every one succeeded).
  const std::string& checkpoint_failure() const;
  // The global model after run(): flat parameters and state.
  const std::vector<float>& global_params() const;
  const std::vector<float>& global_buffers() const;

 private:
  class impl;
  std::unique_ptr<impl> impl_;
};

std::string_view mode_name(training_mode m);

}  // namespace cleave::server
