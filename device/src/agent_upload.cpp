// What a device sends up when its round's training ends: its replicas (in the clear, or held for
// secure aggregation and masked when the server names the mask set), and its privacy report.
#include <algorithm>
#include <cmath>

#include "agent_impl.h"
#include "cleave/protocol/signed_keys.h"

namespace cleave::device {

void agent::impl::report_privacy(std::uint64_t round) {
  if (c_.activation_noise > 0) {
    // Each release of a sample's clipped activation is a Gaussian mechanism on that input of
    // sensitivity 2 C and noise std sigma C; the sample released most often this round bounds
    // every sample's loss (a release of a step later abandoned counts too).
    const std::uint64_t most = releases_.empty() ? 0 : *std::max_element(releases_.begin(), releases_.end());
    std::fill(releases_.begin(), releases_.end(), 0u);
    privacy::rdp_accountant this_round;
    this_round.add_gaussian(c_.activation_noise / 2.0, most);
    spent_.add_gaussian(c_.activation_noise / 2.0, most);
    const double eps = this_round.epsilon(c_.dp_delta), total = spent_.epsilon(c_.dp_delta);
    spdlog::info(
        "device {}: round {}: activation privacy epsilon {:.3g} this round ({} releases of a sample at most), "
        "{:.3g} over the run (delta {:g}, per input sample, Renyi DP)",
        c_.id, round, eps, most, total, c_.dp_delta);
    ex_.metrics().set("cleave_privacy_epsilon", {{"scope", "round"}}, eps);
    ex_.metrics().set("cleave_privacy_epsilon", {{"scope", "run"}}, total);
  }
  auto* nopeek = runner_->filters().find<privacy::nopeek_filter>();
  if (const auto [sum, n] = nopeek ? nopeek->take() : std::pair<double, std::uint64_t>{}; n > 0) {
    spdlog::info("device {}: round {}: distance correlation of inputs and cut activations {:.4f} (NoPeek weight {:g})",
                 c_.id, round, sum / static_cast<double>(n), c_.nopeek);
    ex_.metrics().set("cleave_cut_distance_correlation", {}, sum / static_cast<double>(n));
  }
  if (const auto* g = runner_->filters().find<privacy::gradient_check_filter>(); g && g->monitor().ready()) {
    spdlog::debug("device {}: round {}: label alignment of the gradients from upstream {:.4f}", c_.id, round,
                  g->monitor().mean());
    ex_.metrics().set("cleave_gradient_label_alignment", {}, g->monitor().mean());
  }
}

void agent::impl::check_gradients() {
  const auto* f = runner_->filters().find<privacy::gradient_check_filter>();
  const privacy::gradient_monitor* g = f ? &f->monitor() : nullptr;
  if (!g || !g->suspicious() || warned_round_ == round_) return;
  warned_round_ = round_;
  ex_.metrics().add("cleave_gradient_check_alarms_total", {});
  const std::string what = fmt::format(
      "the gradients from upstream do not follow this device's labels (label alignment {:.4f} over the last {} "
      "micro-batches, below {:g}): the server may be steering this device's features instead of training on its "
      "labels (feature-space hijacking)",
      g->mean(), g->window(), g->threshold());
  if (c_.gradient_check != gradient_check_mode::refuse) {
    spdlog::warn("device {}: round {}: {}", c_.id, round_, what);
    return;
  }
  auto e =
      std::make_exception_ptr(core::error(what + "; refusing to train with this server (--gradient-check refuse)"));
  ex_.post_io([this, e] { ex_.fail(e, "training"); });
}

void agent::impl::upload_replicas(std::uint64_t round, std::uint64_t n_samples, const protocol::round_stats& stats) {
  const split::route& r = plan_->route;
  const auto segs = r.segments_on(core::tier::device);
  const std::uint32_t me = c_.id;
  if (secure_plan_) {
    // The blocks wait here for the mask set; what goes up now is the statistics of the round.
    if (secure_) {
      secure_->held.clear();
      for (int seg : segs) {
        core::stage& st = runner_->host().stage_of(c_.id, seg);
        privacy::held_segment h{r.begin(seg), r.end(seg), std::vector<float>(static_cast<std::size_t>(st.n_params())),
                                std::vector<float>(static_cast<std::size_t>(st.n_buffers()))};
        if (!h.params.empty()) runner_->backend().download(st.params(), h.params.data());
        if (!h.buffers.empty()) runner_->backend().download(st.buffers(), h.buffers.data());
        if (c_.on_upload) c_.on_upload(h.params, h.buffers);
        secure_->held.push_back(std::move(h));
      }
      secure_->n_samples = n_samples;
      secure_->trained = true;
    }
    protocol::replica_desc d;
    d.round = round;
    d.attempt = attempt_;
    d.node_id = c_.id;
    d.n_samples = n_samples;
    d.devices = std::span(&me, 1);
    d.stats = stats;
    post(protocol::make_replica_upload(d, std::span<const float>{}, std::span<const float>{}));
    return;
  }
  for (std::size_t i = 0; i < segs.size(); ++i) {
    protocol::replica_desc d;
    d.round = round;
    d.attempt = attempt_;
    d.node_id = c_.id;
    d.first_block = static_cast<std::uint32_t>(r.begin(segs[i]));
    d.end_block = static_cast<std::uint32_t>(r.end(segs[i]));
    d.n_samples = n_samples;
    d.devices = std::span(&me, 1);
    d.final_part = i + 1 == segs.size();
    if (d.final_part) d.stats = stats;
    core::stage& st = runner_->host().stage_of(c_.id, segs[i]);
    if (!c_.on_upload) {
      post(protocol::make_replica_upload(d, runner_->backend(), st.params(), st.buffers()));
      continue;
    }
    std::vector<float> p(static_cast<std::size_t>(st.n_params())), b(static_cast<std::size_t>(st.n_buffers()));
    if (!p.empty()) runner_->backend().download(st.params(), p.data());
    if (!b.empty()) runner_->backend().download(st.buffers(), b.data());
    c_.on_upload(p, b);
    post(protocol::make_replica_upload(d, p, b));
  }
}

void agent::impl::post_secagg(const protocol::secagg_desc& d) {
  post(protocol::make_secagg(d));
}

void agent::impl::on_secagg(const wire::SecAgg& m) {
  if (!secure_ || m.round() != secure_->client.round() || m.device_id() != c_.id) return;  // of another round
  auto& sec = *secure_;
  const std::uint64_t round = m.round();
  try {
    switch (m.phase()) {
      case wire::SecAggPhase::roster: {
        // Whoever relayed it: every member is a device of this federation that signed its keys.
        const auto roster = protocol::keys_of(m);
        protocol::check_roster(*tls_, round, c_.id, roster, static_cast<int>(m.threshold()), c_.secagg_min_roster);
        const auto blobs = sec.client.share_keys(roster, static_cast<int>(m.threshold()));
        post_secagg({.phase = wire::SecAggPhase::shares, .round = round, .device_id = c_.id, .blobs = blobs});
        return;
      }
      case wire::SecAggPhase::shares:
        for (const auto& b : protocol::blobs_of(m))
          if (!sec.client.receive_share(b.id, b.bytes))
            spdlog::warn("device {}: round {}: the share from device {} does not open; it is not masked with", c_.id,
                         round, b.id);
        return;
      case wire::SecAggPhase::mask_set: {
        if (!sec.trained) throw core::error("the mask set came before this device finished training");
        const auto set = protocol::ids_of(m.devices());
        const auto ranges = protocol::block_ranges_of(m, model_.n_blocks());
        auto words =
            privacy::encode_replica(core::layout_of(model_), ranges, sec.held, static_cast<double>(sec.n_samples));
        sec.client.mask(words, set);
        post_secagg({.phase = wire::SecAggPhase::masked, .round = round, .device_id = c_.id, .words = words});
        spdlog::debug("device {}: round {}: masked upload of {} words for {} devices", c_.id, round, words.size(),
                      set.size());
        return;
      }
      case wire::SecAggPhase::unmask: {
        const auto blobs = sec.client.reveal(protocol::ids_of(m.devices()), protocol::ids_of(m.dropped()));
        post_secagg({.phase = wire::SecAggPhase::reveal, .round = round, .device_id = c_.id, .blobs = blobs});
        return;
      }
      default:
        throw core::error(std::string("a server does not send ") + wire::EnumNameSecAggPhase(m.phase()));
    }
  } catch (const core::error& e) {
    // Nothing more of this round's masking: the server counts this device as dropped.
    spdlog::warn("device {}: round {}: secure aggregation: {}", c_.id, round, e.what());
    post(transport::make_error(wire::ErrorCode::refused,
                               "round " + std::to_string(round) + ": secure aggregation refused: " + e.what()));
    secure_.reset();
  }
}

}  // namespace cleave::device
