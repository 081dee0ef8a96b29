// A malicious server against a real cleave device, at small scale: feature-space hijacking
// (FSHA, Pasquini et al., CCS'21). One device trains LeNet-5 on Fashion-MNIST with its first K
// blocks on the device; the server's side of every gradient that comes back through the cut is
// played by the attacker (the device's hook for hostile servers). The attacker trains, on public
// images the device never sees (the test split's second half), a pilot encoder of the device's
// architecture and a decoder back to images (an autoencoder), and a discriminator telling the
// pilot's features from the device's. Hijacking, it sends the device the gradient that makes its
// features look like the pilot's to the discriminator, so that the decoder inverts them; an honest
// run trains the same networks but passes the server's real gradients on. At the end the
// attacker decodes the device's features of private probes (the test split's first images,
// through the device's final blocks). Printed per run: PSNR and SSIM of those reconstructions,
// the task's test accuracy, the label alignment the device measured per round, and what its
// gradient check (--gradient-check warn) said.
// The attacker scales the gradients it sends (--scale, default 0.005): at full scale the game
// collapses the device's features to zero within two hundred steps.
// Usage: bench_fsha [--data D] [--cut K] [--rounds R] [--steps N] [--scale S] [--backend B]
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "cleave/backend/registry.h"
#include "cleave/core/dataset.h"
#include "cleave/core/model_builder.h"
#include "cleave/core/optimizer.h"
#include "cleave/core/stage.h"
#include "cleave/federation/local_federation.h"
#include "cleave/protocol/protocol.h"
#include "image_quality.h"

namespace fs = std::filesystem;
using namespace cleave;
using cleave::bench::psnr;
using cleave::bench::ssim;

namespace {

// A network of the attacker's with its optimizer.
struct net {
  core::model_spec spec;
  core::stage st;
  core::optimizer opt;
  net(core::backend& b, core::model_spec m, int begin, int end, std::uint64_t seed, float lr)
      : spec(std::move(m)), st(b, spec, begin, end, seed), opt(b, adam(lr), st.n_params()) {}
  static core::optimizer_config adam(float lr) {
    core::optimizer_config c;
    c.kind = core::optimizer_kind::adamw;
    c.lr = lr;
    return c;
  }
  void step() {
    opt.step(st.params(), st.grads());
    st.zero_grad();
  }
};

class attacker {
 public:
  attacker(const std::string& backend, const core::dataset& pub, const core::model_spec& device_model, int cut,
           bool hijack, float scale)
      : be_(backend::make_backend(backend)),
        scale_(scale),
        pub_(pub),
        hijack_(hijack),
        pilot_(*be_, device_model, 0, cut, 99, 1e-3f),
        decoder_(*be_, decoder_spec(device_model, cut), 0, 4, 7, 1e-3f),
        disc_(*be_, disc_spec(device_model, cut), 0, 6, 8, 1e-4f) {}

  // The hook: g (n x d) the server's gradient, z what the device sent.
  void on_gradient(std::vector<float>& g, const std::vector<float>& z, std::int64_t n) {
    auto& b = *be_;
    const std::int64_t per = pub_.item.numel();
    std::vector<std::int64_t> idx(static_cast<std::size_t>(n));
    for (auto& i : idx) i = pub_.size() / 2 + (next_++ % (pub_.size() / 2));
    std::vector<float> x(static_cast<std::size_t>(n * per)), target(x.size());
    std::vector<std::int32_t> y(static_cast<std::size_t>(n));
    pub_.gather(idx.data(), n, x.data(), y.data());
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t k = 0; k < per; ++k)
        target[i * per + k] = pub_.pixels[static_cast<std::size_t>(idx[i] * per + k)] / 255.0f;
    core::tensor xt = b.empty(pilot_.spec.input.batched(n));
    b.upload(xt, x.data());
    // The autoencoder on public data: pilot then decoder, mean squared error of sigmoid outputs.
    core::stage::context pc, dc;
    const core::tensor zp = pilot_.st.forward(xt, pc, core::mode::train);
    const core::tensor logits = decoder_.st.forward(zp, dc, core::mode::train);
    std::vector<float> out(static_cast<std::size_t>(logits.numel()));
    b.download(logits, out.data());
    for (std::size_t k = 0; k < out.size(); ++k) {
      const float s = 1.0f / (1.0f + std::exp(-out[k]));
      out[k] = 2.0f * (s - target[k]) * s * (1 - s) / static_cast<float>(n);
    }
    core::tensor dlog = b.empty(logits.shape());
    b.upload(dlog, out.data());
    const core::tensor dzp = decoder_.st.backward(dlog, dc, true);
    pilot_.st.backward(dzp, pc, false);
    decoder_.step();
    pilot_.step();
    // The discriminator: the pilot's features (class 1) against the device's (class 0).
    core::tensor zd = b.empty(zp.shape());
    b.upload(zd, z.data());
    train_disc(zp, 1, n);
    train_disc(zd, 0, n);
    disc_.step();
    if (!hijack_) return;
    // The device's gradient: make its features pass for the pilot's.
    core::stage::context c;
    const core::tensor l = disc_.st.forward(zd, c, core::mode::train);
    const core::tensor ones = labels(1, n);
    const auto r = core::loss_forward(b, l, ones);
    const core::tensor dz = disc_.st.backward(core::loss_backward(b, r, ones), c, true);
    disc_.st.zero_grad();  // that pass trains only the device
    b.download(dz, g.data());
    for (float& v : g) v *= scale_;  // the attacker chooses the step the device takes
  }

  // PSNR and SSIM of decoding the device's features of probes (test images [0, n)).
  std::pair<double, double> reconstruct(const std::vector<float>& device_params, const core::model_spec& m, int cut,
                                        std::uint64_t seed, const core::dataset& test, std::int64_t n) {
    auto& b = *be_;
    core::stage dev(b, m, 0, cut, seed);
    std::vector<float> p0, buf;
    core::initial_values(m, 0, m.n_blocks(), seed, p0, buf);
    protocol::install(dev, device_params, buf);
    const std::int64_t per = test.item.numel();
    std::vector<std::int64_t> idx(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) idx[static_cast<std::size_t>(i)] = i;
    std::vector<float> x(static_cast<std::size_t>(n * per));
    std::vector<std::int32_t> y(static_cast<std::size_t>(n));
    test.gather(idx.data(), n, x.data(), y.data());
    core::tensor xt = b.empty(m.input.batched(n));
    b.upload(xt, x.data());
    core::stage::context c1, c2;
    const core::tensor logits = decoder_.st.forward(dev.forward(xt, c1, core::mode::train), c2, core::mode::train);
    std::vector<float> out(static_cast<std::size_t>(logits.numel()));
    b.download(logits, out.data());
    double p = 0, s = 0;
    std::vector<float> truth(static_cast<std::size_t>(per));
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t k = 0; k < per; ++k) {
        out[i * per + k] = 1.0f / (1.0f + std::exp(-out[i * per + k]));
        truth[k] = test.pixels[static_cast<std::size_t>(i * per + k)] / 255.0f;
      }
      p += psnr(&out[i * per], truth.data(), per) / static_cast<double>(n);
      s += ssim(&out[i * per], truth.data(), static_cast<int>(test.item[1]), static_cast<int>(test.item[2])) /
           static_cast<double>(n);
    }
    return {p, s};
  }

 private:
  static core::shape cut_shape(const core::model_spec& m, int cut) {
    return m.blocks[static_cast<std::size_t>(cut - 1)].out;
  }
  static core::model_spec decoder_spec(const core::model_spec& m, int cut) {
    core::model_builder d("decoder", cut_shape(m, cut), static_cast<int>(m.input.numel()));
    d.flatten().linear(512).relu().linear(static_cast<int>(m.input.numel()));
    return d.build();
  }
  static core::model_spec disc_spec(const core::model_spec& m, int cut) {
    core::model_builder d("discriminator", cut_shape(m, cut), 2);
    d.flatten().linear(256).relu().linear(64).relu().linear(2);
    return d.build();
  }
  core::tensor labels(std::int32_t v, std::int64_t n) {
    std::vector<std::int32_t> y(static_cast<std::size_t>(n), v);
    core::tensor t = be_->empty({n}, core::dtype::i32);
    be_->upload(t, y.data());
    return t;
  }
  void train_disc(const core::tensor& z, std::int32_t cls, std::int64_t n) {
    core::stage::context c;
    const core::tensor l = disc_.st.forward(z, c, core::mode::train);
    const core::tensor y = labels(cls, n);
    const auto r = core::loss_forward(*be_, l, y);
    disc_.st.backward(core::loss_backward(*be_, r, y, 0.5f), c, false);
  }

  std::unique_ptr<core::backend> be_;
  float scale_;
  const core::dataset& pub_;
  bool hijack_;
  net pilot_, decoder_, disc_;
  std::int64_t next_ = 0;
};

struct outcome {
  double psnr = 0, ssim = 0, accuracy = 0;
  int alarms = 0;
  std::string first_alarm;
  double min_alignment = 1e9, max_alignment = -1e9;  // per round
};

outcome run(const fs::path& work, const std::string& data, const std::string& be, int cut, int rounds, int steps,
            bool hijack, float scale) {
  const auto d = core::load_dataset(data);
  federation::local_config c;
  c.certs = work / "certs";
  federation::provision_local(c.certs, 1, 0);
  c.use_edge = false;
  auto& s = c.server;
  s.model = "lenet5";
  s.data = data;
  s.backend = be;
  s.rounds = rounds;
  s.local_steps = steps;
  s.min_devices = 1;
  s.adaptive = false;
  s.cuts = {cut};
  s.opt.lr = 0.05f;
  const auto spec = core::zoo_model("lenet5", d.train.item, d.train.n_classes);
  attacker atk(be, d.test, spec, cut, hijack, scale);
  device::agent_config a;
  a.id = 1;
  a.data = data;
  a.backend = be;
  a.partition = cleave::core::parse_partition("all");
  a.gradient_check = cleave::device::gradient_check_mode::warn;
  a.on_gradient = [&](std::vector<float>& g, const std::vector<float>& z, std::int64_t n) { atk.on_gradient(g, z, n); };
  c.devices.push_back(a);
  // The device's log, as its operator would read it (with the round's label alignment, a debug
  // line); the console keeps warnings only.
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  sink->set_level(spdlog::level::debug);
  for (auto& k : spdlog::default_logger()->sinks()) k->set_level(spdlog::level::warn);
  spdlog::default_logger()->sinks().push_back(sink);
  spdlog::set_level(spdlog::level::debug);
  const auto result = federation::run_local(c);
  spdlog::set_level(spdlog::level::warn);
  spdlog::default_logger()->sinks().pop_back();
  outcome out;
  out.accuracy = result.rounds.back().test_accuracy;
  std::tie(out.psnr, out.ssim) = atk.reconstruct(result.global_params, spec, cut, s.seed, d.test, 256);
  std::istringstream lines(log.str());
  for (std::string line; std::getline(lines, line);) {
    const std::string per_round = "label alignment of the gradients from upstream ";
    if (const auto at = line.find(per_round); at != std::string::npos) {
      const double v = std::stod(line.substr(at + per_round.size()));
      out.min_alignment = std::min(out.min_alignment, v);
      out.max_alignment = std::max(out.max_alignment, v);
    }
    if (line.find("do not follow this device's labels") != std::string::npos) {
      if (out.alarms++ == 0) {
        const auto at = line.find("round ");
        out.first_alarm = at == std::string::npos ? "?" : line.substr(at, line.find(':', at) - at);
      }
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = "fashion-mnist", backend = "auto";
  int cut = 3, rounds = 3, steps = 100;
  float scale = 0.005f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--data")
      data = v;
    else if (a == "--backend")
      backend = v;
    else if (a == "--cut")
      cut = std::stoi(v);
    else if (a == "--rounds")
      rounds = std::stoi(v);
    else if (a == "--steps")
      steps = std::stoi(v);
    else if (a == "--scale")
      scale = std::stof(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);
  const fs::path work = fs::temp_directory_path() / ("cleave-fsha-" + std::to_string(::getpid()));
  std::printf("feature-space hijacking of a LeNet-5 device holding %d blocks (%d rounds x %d steps)\n", cut, rounds,
              steps);
  std::printf("%-10s %7s %7s %9s %17s  %s\n", "server", "PSNR", "SSIM", "accuracy", "label alignment",
              "gradient check");
  for (const bool hijack : {false, true}) {
    const auto o = run(work, data, backend, cut, rounds, steps, hijack, scale);
    const std::string check =
        o.alarms ? "alarm in " + std::to_string(o.alarms) + " round(s), first " + o.first_alarm : "quiet";
    std::printf("%-10s %7.2f %7.3f %9.4f %8.3f - %6.3f  %s\n", hijack ? "hijacking" : "honest", o.psnr, o.ssim,
                o.accuracy, o.min_alignment, o.max_alignment, check.c_str());
    std::fflush(stdout);
  }
  std::error_code ec;
  fs::remove_all(work, ec);
  return 0;
}
