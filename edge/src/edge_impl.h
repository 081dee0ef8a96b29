// The edge node's inside, shared by its source files: edge_node.cpp (links, plans, rounds,
// steps) and edge_replicas.cpp (the round's uploads: checked, held, pre-averaged, flushed).
#pragma once

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <map>
#include <optional>

#include "cleave/edge/edge_node.h"
#include "cleave/protocol/protocol.h"
#include "cleave/runtime/executors.h"
#include "cleave/runtime/segment_runner.h"
#include "cleave/runtime/sessions.h"
#include "cleave/runtime/upload_collector.h"

namespace cleave::edge {

using clock = std::chrono::steady_clock;

class edge_node::impl {
 public:
  explicit impl(edge_config c) : c_(std::move(c)), ex_("edge " + std::to_string(c_.id)), flush_timer_(ex_.io()) {}
  int run();
  void stop() { ex_.stop("stopped"); }
  void stop_on_signals() { ex_.stop_on_signals(); }
  std::atomic<std::uint16_t> port_{0};

 private:
  struct device_state {
    runtime::session_ptr s;        // its current session (null: not connected here)
    std::vector<std::byte> hello;  // passed on to the server again after a reconnect
    runtime::route_state rs;
    bool planned = false, expected = false;
    std::uint64_t n_samples = 0;              // its upload's, this round
    std::vector<runtime::upload_part> parts;  // its upload, this round
    float reported_bps = 0;                   // its link's bandwidth in the last profile sent
    clock::time_point heard{};                // its last message in this collection
  };

  // Server side.
  void on_upstream_connected(const runtime::session_ptr& s);
  void on_server(transport::message m);
  void on_plan(const transport::message& m);
  void on_round_start(const wire::RoundStart& r);
  // Device side.
  void on_hello(const runtime::session_ptr& s, const transport::message& hello);
  void on_device(const runtime::session_ptr& s, transport::message m);
  void on_device_closed(const runtime::session_ptr& s, const std::string& why);
  // A part of a device's upload: checked against its plan and steps (a violation closes its
  // channel), held until the flush.
  void on_replica(device_state& d, const wire::ReplicaUpload& r);
  void on_cutover(device_state& d, const transport::message& m);
  // Both: a step message for `dev` from tier `from`, run on the compute thread.
  void step(std::uint32_t dev, transport::message m, core::tier from);
  // Blocks migrating here for the device of session s; a bad one closes that session.
  void install(const runtime::session_ptr& s, transport::message m);
  void relay_down(std::uint32_t dev, const transport::message& m);
  void send_profile(split::node_profile prof);
  // A link to the device or the server whose measured figure moved since the last profile is
  // reported now: the splitter may move blocks off or back onto it.
  void report_moved_links(const device_state& d);
  void maybe_flush(bool deadline);
  // Collection `turn` stops expecting a device it hears nothing from for silence_ (a quarter of
  // the deadline, at least 10 s, as the server counts it out; a device at work says so sooner).
  asio::awaitable<void> count_out_silent(std::uint64_t turn);
  asio::awaitable<void> flush(std::vector<std::uint32_t> done, std::uint64_t turn);
  // The parts of the round's upload (per device, or one pre-average) of the devices that finished,
  // with this edge's replicas of each (`mine`, in the order of `done`).
  struct upload_part {
    std::vector<std::uint32_t> devices;
    int first = 0, end = 0;
    std::uint64_t n_samples = 0;
    std::vector<float> params = {}, buffers = {};
  };
  using replica_sets = std::vector<std::vector<runtime::segment_runner::replica>>;
  std::vector<upload_part> device_parts(const std::vector<std::uint32_t>& done, replica_sets& mine);
  std::vector<upload_part> pre_average(const std::vector<std::uint32_t>& done, const replica_sets& mine);

  edge_config c_;
  runtime::executors ex_;
  std::optional<transport::tls_context> tls_;
  std::optional<runtime::upstream> up_;
  std::optional<transport::link_schedule> schedule_;
  std::optional<runtime::acceptor> below_;
  std::unique_ptr<core::backend> be_;
  std::optional<runtime::segment_runner> runner_;  // compute thread
  std::string model_json_;
  core::model_spec model_;
  std::uint64_t memory_budget_ = 0;
  int n_steps_ = 0;  // compute thread: device steps seen
  std::optional<split::node_profile> latest_profile_;
  float up_reported_bps_ = 0;  // the server link's bandwidth in the last profile sent
  std::map<std::uint32_t, device_state> devices_;
  std::uint64_t run_id_ = 0;  // of the plans in force
  // Compute thread: what each device's segments here started its last round from (a round run
  // again, after the server resumed from its checkpoint, starts from it too).
  struct round_start {
    std::uint64_t round = 0;
    split::route route;
    std::vector<runtime::segment_runner::optimizer_state> optimizer;
  };
  std::map<std::uint32_t, round_start> started_;

  // The round being relayed, and the attempt at it (a round nobody finished runs again).
  std::uint64_t round_ = 0;
  std::uint32_t attempt_ = 0;
  bool collecting_ = false, flushing_ = false;
  // Collections started: one a round, or in sequential mode one a device's turn.
  std::uint64_t turn_ = 0;
  // The server's aggregation rule needs each device's own replicas (from its Welcome): no
  // pre-average, every device's replicas go up on their own.
  bool per_device_ = false;
  // The server's plans aggregate device replicas securely: devices upload statistics here, their
  // blocks go up masked (SecAgg, relayed as they come) and only this edge's own blocks are summed.
  bool secure_ = false;
  std::uint64_t local_steps_ = 0, batch_ = 0;  // of the round and the plan: the samples a device may claim
  runtime::upload_collector uploads_;          // of the devices, this collection
  std::vector<std::uint32_t> arrived_;         // devices in the order their uploads completed
  std::chrono::milliseconds patience_{0};
  clock::duration silence_{};
  asio::steady_timer flush_timer_;
  std::uint64_t bytes_mark_ = 0;
};

}  // namespace cleave::edge
