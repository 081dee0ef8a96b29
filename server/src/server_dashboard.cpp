// The server's dashboard (`--dashboard`): one page, embedded in the binary, that draws the
// federation from /api/state, which it polls: the topology, each device's route over the
// model's blocks, the curves of the rounds and the links. The state is made on the I/O thread
// (it reads sessions and devices); when that thread cannot answer within a second (a stopping
// node) the last state made is served.
#include <spdlog/spdlog.h>

#include "cleave/metrics/exporter.h"
#include "server_impl.h"

namespace cleave::server {

extern const char dashboard_html[];  // dashboard/index.html, embedded by the build

namespace {

std::string_view phase_name(int at) {
  static constexpr std::string_view names[] = {"idle", "waiting for devices", "training", "averaging"};
  return names[at];
}

// JSON inside a <script> element: "</" would end it early.
std::string script_safe(std::string json) {
  for (std::size_t at = 0; (at = json.find("</", at)) != std::string::npos; at += 3) json.replace(at, 2, "<\\/");
  return json;
}

}  // namespace

void server_node::impl::open_dashboard() {
  std::vector<metrics::page> pages{
      {"/", "text/html; charset=utf-8",
       [this] {
         // The first state comes with the page: it shows the federation before any script polls.
         std::string html = dashboard_html;
         static const std::string slot = "__CLEAVE_STATE__";
         if (const auto at = html.find(slot); at != std::string::npos)
           html.replace(at, slot.size(), script_safe(dashboard_state()));
         return html;
       }},
      {"/api/state", "application/json", [this] { return dashboard_state(); }},
  };
  metrics::http_options o{"--dashboard", c_.dashboard_token, true};
  const std::uint16_t port = ex_.serve_pages(c_.dashboard, std::move(pages), o);
  const auto host = metrics::parse_listen_address(c_.dashboard, "--dashboard").first;
  spdlog::info("server: dashboard on http://{}:{}/{}", host.find(':') == std::string::npos ? host : "[" + host + "]",
               port, c_.dashboard_token.empty() ? "" : " (with ?token=...)");
}

std::string server_node::impl::dashboard_state() {
  auto made = std::make_shared<std::string>();
  if (ex_.run_on_io([this, made] { *made = board().dump(); }, std::chrono::seconds(1))) {
    const std::lock_guard lock(board_mu_);
    board_cache_ = *made;
    return *made;
  }
  const std::lock_guard lock(board_mu_);
  return board_cache_;
}

nlohmann::json server_node::impl::board() const {
  using nlohmann::json;
  json blocks = json::array();
  for (int i = 0; i < model_.n_blocks(); ++i) {
    const auto& b = model_.blocks[static_cast<std::size_t>(i)];
    blocks.push_back({{"index", i},
                      {"kind", b.kind},
                      {"params", b.n_params},
                      {"flops", b.flops},
                      {"activation_bytes", b.out.numel() * 4}});
  }
  const json links = board_links();
  json edges = json::array();
  for (const auto& l : links)
    if (l["role"] == "edge") edges.push_back({{"name", l["to"]}, {"connected", l["up"]}});
  return {{"server", c_.name},
          {"model", model_.name},
          {"params", model_.n_params()},
          {"mode", mode_name(c_.mode)},
          {"u_shape", c_.u_shape},
          {"adaptive", book_ != nullptr},
          {"backend", be_ ? be_->name() : ""},
          {"run_id", fmt::format("{:016x}", run_id_)},
          {"rounds", c_.rounds},
          {"round", last_.round},
          {"current_round", round_.number},
          {"phase", phase_name(static_cast<int>(round_.at))},
          {"devices_connected", n_connected()},
          {"blocks", blocks},
          {"edges", edges},
          {"devices", board_devices()},
          {"links", links},
          {"history", history_}};
}

nlohmann::json server_node::impl::board_devices() const {
  using nlohmann::json;
  json devices = json::array();
  for (const auto& [id, d] : devices_) {
    json segments = json::array();
    for (int s = 0; s < d.rs.route.n_segments(); ++s)
      segments.push_back({{"tier", core::tier_name(d.rs.route.path[static_cast<std::size_t>(s)])},
                          {"begin", d.rs.route.begin(s)},
                          {"end", d.rs.route.end(s)}});
    devices.push_back({{"id", id},
                       {"name", d.name},
                       {"connected", d.connected},
                       {"via", d.behind_edge && d.via ? d.via->identity : c_.name},
                       {"route", d.rs.route.str()},
                       {"segments", segments},
                       {"joined_round", d.joined_round},
                       {"moved_round", d.moved_round},
                       {"training", round_.members.count(id) > 0 && !round_.done.count(id)},
                       {"predicted_step_seconds", d.predicted_step_seconds}});
  }
  return devices;
}

nlohmann::json server_node::impl::board_links() const {
  using nlohmann::json;
  std::map<std::uint32_t, std::string> edge_names;  // node id -> certificate name
  json links = json::array();
  if (acceptor_) {
    for (const auto& s : acceptor_->sessions())
      if (s->role == core::tier::edge) edge_names[s->id] = s->identity;
    for (const auto& l : acceptor_->links())
      links.push_back({{"from", c_.name},
                       {"to", l.peer},
                       {"role", core::tier_name(l.role)},
                       {"up", l.up},
                       {"rtt_seconds", transport::link_rtt_us(l.last) * 1e-6},
                       {"send_bytes_per_second", l.last.send_bytes_per_second},
                       {"receive_bytes_per_second", l.last.receive_bytes_per_second},
                       {"sent_bytes", l.sent},
                       {"received_bytes", l.received},
                       {"measured_by", c_.name}});
  }
  if (!book_) return links;
  // The links below the edges, as the devices measured them (the profiles the splitter reads).
  auto name_of = [&](const split::node_key& k) -> std::string {
    if (k.role == core::tier::server) return c_.name;
    if (k.role == core::tier::edge) {
      const auto it = edge_names.find(k.id);
      return it != edge_names.end() ? it->second : "edge " + std::to_string(k.id);
    }
    const auto it = devices_.find(k.id);
    return it != devices_.end() ? it->second.name : "device " + std::to_string(k.id);
  };
  for (const auto& m : book_->links()) {
    if (m.from.role != core::tier::device || m.to.role != core::tier::edge) continue;
    const auto dev = devices_.find(m.from.id);
    links.push_back({{"from", name_of(m.to)},
                     {"to", name_of(m.from)},
                     {"role", "device"},
                     {"up", dev != devices_.end() && dev->second.connected},
                     {"rtt_seconds", m.rtt_seconds},
                     {"send_bytes_per_second", m.bytes_per_second},
                     {"receive_bytes_per_second", m.bytes_per_second},
                     {"measured_by", name_of(m.from)}});
  }
  return links;
}

}  // namespace cleave::server
