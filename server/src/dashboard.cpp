// The server's dashboard (`--dashboard`): one page, embedded in the binary, that draws the
// federation from /api/state, which it polls: the topology, each device's route over the
// model's blocks, the curves of the rounds and the links. The state is made on the I/O thread
// (it reads sessions and devices); when that thread cannot answer within a second (a stopping
// node) the last state made is served.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cleave/backend/registry.h"
#include "cleave/core/clock.h"
#include "cleave/metrics/exporter.h"
#include "publisher.h"

namespace cleave::server {

extern const char dashboard_html[];  // dashboard/index.html, embedded by the build

namespace {

// JSON inside a <script> element: "</" would end it early.
std::string script_safe(std::string json) {
  for (std::size_t at = 0; (at = json.find("</", at)) != std::string::npos; at += 3) json.replace(at, 2, "<\\/");
  return json;
}

}  // namespace

std::string dashboard_page(const std::string& state) {
  // The first state comes with the page: it shows the federation before any script polls.
  std::string html = dashboard_html;
  static const std::string slot = "__CLEAVE_STATE__";
  if (const auto at = html.find(slot); at != std::string::npos) html.replace(at, slot.size(), script_safe(state));
  return html;
}

void publisher::open_dashboard() {
  const auto& c = v_.c;
  std::vector<metrics::page> pages{
      {"/", "text/html; charset=utf-8", [this] { return dashboard_page(dashboard_state()); }},
      {"/api/state", "application/json", [this] { return dashboard_state(); }},
  };
  metrics::http_options o{"--dashboard", c.dashboard_token};
  const std::uint16_t port = v_.ex.serve_pages(c.dashboard, std::move(pages), o);
  const auto host = metrics::parse_listen_address(c.dashboard, "--dashboard").first;
  spdlog::info("server: dashboard on http://{}:{}/{}", host.find(':') == std::string::npos ? host : "[" + host + "]",
               port, c.dashboard_token.empty() ? "" : " (with ?token=...)");
}

std::string publisher::dashboard_state() {
  auto made = std::make_shared<std::string>();
  if (v_.ex.run_on_io([this, made] { *made = board().dump(); }, std::chrono::seconds(1))) {
    const std::lock_guard lock(board_mu_);
    board_cache_ = *made;
    return *made;
  }
  const std::lock_guard lock(board_mu_);
  return board_cache_;
}

nlohmann::json publisher::board() const {
  using nlohmann::json;
  const auto& c = v_.c;
  const auto& model = v_.model;
  json blocks = json::array();
  for (int i = 0; i < model.n_blocks(); ++i) {
    const auto& b = model.blocks[static_cast<std::size_t>(i)];
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
  json out = {{"server", c.name},
              {"model", model.name},
              {"params", model.n_params()},
              {"mode", mode_name(c.mode)},
              {"u_shape", c.u_shape},
              {"adaptive", v_.plans.book() != nullptr},
              {"backend", backend_},
              {"run_id", fmt::format("{:016x}", run_id_)},
              {"rounds", c.rounds},
              {"round", v_.now.last().round},
              {"current_round", v_.now.number()},
              {"phase", phase_name(v_.now.phase())},
              {"devices_connected", v_.members.n_connected()},
              {"blocks", blocks},
              {"edges", edges},
              {"devices", board_devices()},
              {"links", links},
              {"local_steps", c.local_steps},
              {"batch", c.batch},
              {"started_at", started_at_},
              {"now", core::unix_now()},
              {"history", history_},
              {"cuts", board_cuts()},
              {"cuts_total", v_.plans.cut_events().empty() ? 0 : v_.plans.cut_events().back().n}};
  if (c.jobs_state) out["jobs"] = json::parse(c.jobs_state());  // a long-running server's queue
  return out;
}

nlohmann::json publisher::board_devices() const {
  using nlohmann::json;
  json devices = json::array();
  for (const auto& [id, d] : v_.members.all()) {
    json segments = json::array();
    const auto pace = v_.now.pace_of(id);
    for (int s = 0; s < d.rs.route.n_segments(); ++s)
      segments.push_back({{"tier", core::tier_name(d.rs.route.path[static_cast<std::size_t>(s)])},
                          {"begin", d.rs.route.begin(s)},
                          {"end", d.rs.route.end(s)}});
    devices.push_back({{"id", id},
                       {"name", d.name},
                       {"connected", d.connected},
                       {"via", d.behind_edge && d.via ? d.via->identity : v_.c.name},
                       {"route", d.rs.route.str()},
                       {"segments", segments},
                       {"joined_round", d.joined_round},
                       {"moved_round", d.moved_round},
                       {"training", v_.now.member(id) && !v_.now.done(id)},
                       {"state", !d.connected         ? "offline"
                                 : !v_.now.member(id) ? "waiting"
                                 : v_.now.done(id)    ? "done"
                                                      : "training"},
                       {"steps", pace.steps},
                       {"step_seconds", pace.step_seconds},
                       {"predicted_step_seconds", predicted_.count(id) ? predicted_.at(id) : 0.0}});
  }
  return devices;
}

nlohmann::json publisher::board_cuts() const {
  nlohmann::json cuts = nlohmann::json::array();
  const auto& events = v_.plans.cut_events();
  const std::size_t from = events.size() > max_board_cuts ? events.size() - max_board_cuts : 0;
  for (std::size_t i = from; i < events.size(); ++i) {
    const auto& e = events[i];
    cuts.push_back({{"at", e.at},
                    {"device", e.device},
                    {"from", e.from},
                    {"to", e.to},
                    {"why", e.why.text},
                    {"step_before", e.why.step_before},
                    {"step_after", e.why.step_after}});
  }
  return cuts;
}

nlohmann::json publisher::board_links() const {
  using nlohmann::json;
  const std::string& me = v_.c.name;
  std::map<std::uint32_t, std::string> edge_names;  // node id -> certificate name
  json links = json::array();
  if (v_.acceptor) {
    for (const auto& s : v_.acceptor->sessions())
      if (s->role == core::tier::edge) edge_names[s->id] = s->identity;
    for (const auto& l : v_.acceptor->links())
      links.push_back({{"from", me},
                       {"to", l.peer},
                       {"role", core::tier_name(l.role)},
                       {"up", l.up},
                       {"rtt_seconds", transport::link_rtt_us(l.last) * 1e-6},
                       {"send_bytes_per_second", l.last.send_bytes_per_second},
                       {"receive_bytes_per_second", l.last.receive_bytes_per_second},
                       {"sent_bytes", l.sent},
                       {"received_bytes", l.received},
                       {"measured_by", me}});
  }
  const auto* book = v_.plans.book();
  if (!book) return links;
  // The links below the edges, as the devices measured them (the profiles the splitter reads).
  auto name_of = [&](const split::node_key& k) -> std::string {
    if (k.role == core::tier::server) return me;
    if (k.role == core::tier::edge) {
      const auto it = edge_names.find(k.id);
      return it != edge_names.end() ? it->second : "edge " + std::to_string(k.id);
    }
    const auto* d = v_.members.find(k.id);
    return d ? d->name : "device " + std::to_string(k.id);
  };
  for (const auto& m : book->links()) {
    if (m.from.role != core::tier::device || m.to.role != core::tier::edge) continue;
    const auto* dev = v_.members.find(m.from.id);
    links.push_back({{"from", name_of(m.to)},
                     {"to", name_of(m.from)},
                     {"role", "device"},
                     {"up", dev && dev->connected},
                     {"rtt_seconds", m.rtt_seconds},
                     {"send_bytes_per_second", m.bytes_per_second},
                     {"receive_bytes_per_second", m.bytes_per_second},
                     {"measured_by", name_of(m.from)}});
  }
  return links;
}

}  // namespace cleave::server
