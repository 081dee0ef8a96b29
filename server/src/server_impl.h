// The server node's wiring: its sessions, and the parts it joins: membership, the round, the
// splitter, the checkpoint store and the publisher (each behind its own interface), and the
// compute side (the segment runner and the evaluating trainer).
#pragma once

#include <memory>
#include <optional>

#include "admin_desk.h"
#include "checkpoint_store.h"
#include "cleave/runtime/executors.h"
#include "cleave/runtime/node_metrics.h"
#include "cleave/runtime/segment_runner.h"
#include "cleave/server/server_node.h"
#include "membership.h"
#include "publisher.h"
#include "round.h"
#include "splitter.h"

namespace cleave::server {

class server_node::impl {
 public:
  explicit impl(server_config c);
  round_report run();
  void stop(std::string why = "stopped") { ex_.stop(std::move(why)); }
  void stop_on_signals() { ex_.stop_on_signals(); }
  global_model global_;
  std::string checkpoint_failure_;  // the last failed checkpoint write

 private:
  // The round's view of the server (round_wiring.cpp).
  class wiring final : public round_host {
   public:
    explicit wiring(impl& s) : s_(s) {}
    std::vector<member> connected() const override;
    bool attached(std::uint32_t id, const void* via) const override;
    const split::route& route_of(std::uint32_t id) const override;
    std::uint32_t plan_epoch() const override;
    void post(std::uint32_t id, transport::message_builder m) override;
    void opening(std::uint64_t number) override;
    std::function<void()> installer(const device_routes& routes, float lr, const global_model& g) override;
    void gather(const device_routes& routes, const std::set<std::uint32_t>& in, split::aggregator& avg) override;
    void discard(const device_routes& routes) override;
    evaluation evaluate(const global_model& g, bool evaluate, bool whole) override;
    std::uint64_t bytes_moved() const override;
    double predicted_step(const std::set<std::uint32_t>& in, std::vector<round_report::leg>* legs) override;
    asio::awaitable<void> closed(const round_report& rep, const device_routes& routes) override;

   private:
    impl& s_;
  };

  // Sessions and membership (I/O thread).
  void on_hello(const runtime::session_ptr& s, const transport::message& hello);
  void on_message(const runtime::session_ptr& s, transport::message m);
  void on_closed(const runtime::session_ptr& s, const std::string& why);
  void register_device(const runtime::session_ptr& via, const wire::Hello& h);
  void device_gone(std::uint32_t id, const std::string& reason);
  void on_step(const runtime::session_ptr& s, transport::message m);
  void on_replica(const runtime::session_ptr& s, const wire::ReplicaUpload& r);
  void on_secagg(const runtime::session_ptr& s, const wire::SecAgg& m);
  void on_cutover(const runtime::session_ptr& s, const wire::Cutover& c);
  void on_migrate(const runtime::session_ptr& s, transport::message m);
  // A device's compute failed here (bad blocks or steps it or its edge sent): the device's
  // own session closes, or only that device is dropped when an edge sent it.
  void device_failed(const runtime::session_ptr& s, std::uint32_t dev, const std::string& why);
  void send_global(const runtime::session_ptr& to, std::uint32_t device_id);
  void replan(const std::string& why);
  void publish_profile();  // compute thread: the server's live profile to the splitter
  // Rounds.
  float round_lr(std::uint64_t r) const;
  asio::awaitable<bool> wait_for_members();
  asio::awaitable<void> drive_rounds();
  // Start: settings checked (throws core::error naming the first bad one), the model and its
  // test data, the newest readable checkpoint resumed (or a new run), listening.
  void check_config() const;
  void load_model();
  void resume_or_start();
  void listen();

  server_config c_;
  runtime::executors ex_;
  runtime::signal wake_;  // membership changed, a replica came in, a round ended
  std::optional<transport::tls_context> tls_;
  std::optional<runtime::acceptor> acceptor_;
  std::optional<transport::link_schedule> schedule_;
  core::model_spec model_;
  std::shared_ptr<const core::data_source> test_;         // evaluates the global model
  std::shared_ptr<const core::data_source> eval_subset_;  // --eval-samples of the test split
  std::unique_ptr<core::backend> be_;
  std::optional<runtime::segment_runner> runner_;  // compute thread
  std::unique_ptr<core::trainer> eval_;            // compute thread
  int n_stepped_ = 0;                              // compute thread
  std::uint64_t memory_budget_ = 0;
  membership members_;
  admin_desk desk_{c_.on_admin};  // operators' sessions (a long-running server's jobs)
  splitter plans_;
  checkpoint_store store_;
  wiring wiring_;
  round round_;
  publisher publisher_;
  std::uint64_t run_id_ = 0;  // this run's (kept when resumed)
  std::uint64_t first_round_ = 1;
  // From the checkpoint resumed: each device's server replicas' optimizer state, installed in
  // its first round.
  optimizer_states resumed_opt_;
};

}  // namespace cleave::server
