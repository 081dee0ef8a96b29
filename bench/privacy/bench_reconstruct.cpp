// Input reconstruction from the activations a device sends up at its cut, against real cleave
// runs: a federation of two devices trains LeNet-5 or ResNet-8 on Fashion-MNIST with the
// device's blocks fixed to the first K, and every activation frame device 1 sends in the last
// steps is kept. The attacker is the server of a plain SplitFed run: it holds the trained
// device blocks (the device replicas it averages) and public data the devices never trained on
// (the first --public images of the test split). It computes the blocks' activations of the
// public images (clipped and noised as the device does, with noise of its own), fits a decoder
// from activations to images on them (kernel ridge regression, Gaussian kernel on activations
// scaled to unit norm, bandwidth by the median heuristic), and decodes the victim's
// activations. Printed per model and cut: PSNR and SSIM of the reconstructions against the true
// inputs, without and with each defence, the model's test accuracy, the epsilon per round the
// noise gives, and the floor (PSNR of the public mean image: an attacker learning nothing).
// The clipping bound is the median activation norm of the cut without a defence (or --clip C);
// NoPeek rows train with that weight of distance correlation on the device's loss.
// Usage: bench_reconstruct [--data D] [--models lenet5,resnet8]
//   [--cuts lenet5:1,3,6;resnet8:1,2] [--steps N] [--public P] [--victims V] [--clip C]
//   [--noise 0.01,0.03,0.1] [--nopeek 1,4] [--backend B]
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "capture.h"
#include "cleave/backend/registry.h"
#include "cleave/core/dataset.h"
#include "cleave/core/random.h"
#include "cleave/core/stage.h"
#include "cleave/privacy/cut_defence.h"
#include "cleave/protocol/protocol.h"
#include "cleave/transport/message.h"
#include "image_quality.h"

namespace fs = std::filesystem;
using namespace cleave;
using cleave::bench::psnr;
using cleave::bench::ssim;

namespace {

std::vector<std::string> split_list(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, sep);)
    if (!t.empty()) out.push_back(t);
  return out;
}

// Images in [0, 1] (H x W, one channel) of samples idx.
std::vector<float> images_of(const core::dataset& d, const std::vector<std::int64_t>& idx) {
  const std::int64_t per = d.item.numel();
  std::vector<float> out(idx.size() * static_cast<std::size_t>(per));
  for (std::size_t i = 0; i < idx.size(); ++i)
    for (std::int64_t k = 0; k < per; ++k)
      out[i * per + k] = d.pixels[static_cast<std::size_t>(idx[i] * per + k)] / 255.0f;
  return out;
}

// Kernel ridge regression with a Gaussian kernel: fit on (features f, targets y) of n rows,
// predict targets of m query rows q.
class decoder {
 public:
  decoder(const std::vector<float>& f, std::int64_t n, std::int64_t d, const std::vector<float>& y, std::int64_t dy,
          double ridge)
      : f_(f), n_(n), d_(d), dy_(dy) {
    std::vector<double> dist2(static_cast<std::size_t>(n * n));
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = i; j < n; ++j) dist2[i * n + j] = dist2[j * n + i] = sq(&f[i * d], &f[j * d]);
    std::vector<double> off;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = i + 1; j < n; ++j) off.push_back(dist2[i * n + j]);
    std::nth_element(off.begin(), off.begin() + off.size() / 2, off.end());
    gamma_ = 1.0 / std::max(off[off.size() / 2], 1e-12);
    // (K + ridge I) alpha = y by Cholesky.
    std::vector<double> k(dist2.size());
    for (std::size_t t = 0; t < k.size(); ++t) k[t] = std::exp(-gamma_ * dist2[t]);
    for (std::int64_t i = 0; i < n; ++i) k[i * n + i] += ridge;
    for (std::int64_t j = 0; j < n; ++j) {
      double s = k[j * n + j];
      for (std::int64_t p = 0; p < j; ++p) s -= k[j * n + p] * k[j * n + p];
      k[j * n + j] = std::sqrt(s);
      for (std::int64_t i = j + 1; i < n; ++i) {
        double t = k[i * n + j];
        for (std::int64_t p = 0; p < j; ++p) t -= k[i * n + p] * k[j * n + p];
        k[i * n + j] = t / k[j * n + j];
      }
    }
    alpha_.assign(static_cast<std::size_t>(n * dy), 0.0);
    for (std::int64_t c = 0; c < dy; ++c) {
      std::vector<double> z(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) {
        double t = y[i * dy + c];
        for (std::int64_t p = 0; p < i; ++p) t -= k[i * n + p] * z[p];
        z[i] = t / k[i * n + i];
      }
      for (std::int64_t i = n - 1; i >= 0; --i) {
        double t = z[i];
        for (std::int64_t p = i + 1; p < n; ++p) t -= k[p * n + i] * alpha_[p * dy + c];
        alpha_[i * dy + c] = t / k[i * n + i];
      }
    }
  }
  std::vector<float> predict(const float* q) const {
    std::vector<double> out(static_cast<std::size_t>(dy_), 0.0);
    for (std::int64_t i = 0; i < n_; ++i) {
      const double w = std::exp(-gamma_ * sq(q, &f_[i * d_]));
      for (std::int64_t c = 0; c < dy_; ++c) out[c] += w * alpha_[i * dy_ + c];
    }
    std::vector<float> r(out.size());
    for (std::size_t c = 0; c < out.size(); ++c) r[c] = static_cast<float>(std::clamp(out[c], 0.0, 1.0));
    return r;
  }

 private:
  double sq(const float* a, const float* b) const {
    double s = 0;
    for (std::int64_t k = 0; k < d_; ++k) s += double(a[k] - b[k]) * (a[k] - b[k]);
    return s;
  }
  const std::vector<float>& f_;
  std::int64_t n_, d_, dy_;
  double gamma_ = 1;
  std::vector<double> alpha_;
};

struct setting {
  std::string model, data, backend;
  int cut = 1, steps = 150, n_public = 1500, n_victims = 256;
  double clip = 0, noise = 0, nopeek = 0;
};

struct outcome {
  double psnr = 0, ssim = 0, floor_psnr = 0, accuracy = 0, epsilon = 0, median_norm = 0;
  std::int64_t dim = 0;
};

outcome run(const fs::path& work, const setting& st) {
  bench::frame_capture cap;
  auto c = bench::capturing_federation(work, st.model, st.data, st.backend, 2, 1, st.steps, cap,
                                       [&](device::agent_config& a) {
                                         a.activation_clip = st.clip;
                                         a.activation_noise = st.noise;
                                         a.nopeek = st.nopeek;
                                         a.gradient_check = cleave::device::gradient_check_mode::off;
                                       });
  c.server.cuts = {st.cut};
  const auto& s = c.server;
  const auto result = federation::run_local(c);
  outcome out;
  out.accuracy = result.rounds.back().test_accuracy;

  const auto d = core::load_dataset(st.data);
  const std::int64_t per = d.train.item.numel();
  bench::sample_stream stream(d.train.size(), device::default_order_seed(1, 1));
  // The victim: the last activation frames device 1 sent, and the inputs behind them.
  std::vector<float> victim;
  std::vector<std::int64_t> victim_idx;
  std::int64_t dim = 0;
  std::uint64_t max_releases = 0;
  std::map<std::int64_t, std::uint64_t> releases;
  for (auto it = cap.frames.rbegin(); it != cap.frames.rend() && static_cast<int>(victim_idx.size()) < st.n_victims;
       ++it) {
    auto m = bench::decode_captured(*it);
    const auto* a = m.ok() ? m->as<wire::Activations>() : nullptr;
    if (!a) continue;
    const auto v = transport::view_of(*a->activation());
    const auto vals = v.values<float>();
    const std::int64_t rows = v.shape[0];
    dim = static_cast<std::int64_t>(vals.size()) / rows;
    // Round 1's steps are numbered from local_steps on; the device's stream starts with them.
    const std::int64_t first = (static_cast<std::int64_t>(a->step()) - st.steps) * s.batch + a->micro_batch() * rows;
    for (std::int64_t i = 0; i < rows; ++i) {
      victim_idx.push_back(stream.index_at(first + i));
      victim.insert(victim.end(), vals.begin() + i * dim, vals.begin() + (i + 1) * dim);
    }
  }
  for (std::int64_t pos = 0; pos < static_cast<std::int64_t>(st.steps) * s.batch; ++pos)
    max_releases = std::max(max_releases, ++releases[stream.index_at(pos)]);
  const std::int64_t nv = static_cast<std::int64_t>(victim_idx.size());
  out.dim = dim;
  if (nv == 0) throw core::error("no activation frames from device 1");
  std::vector<double> norms(static_cast<std::size_t>(nv));
  for (std::int64_t i = 0; i < nv; ++i) {
    double q = 0;
    for (std::int64_t k = 0; k < dim; ++k) q += double(victim[i * dim + k]) * victim[i * dim + k];
    norms[static_cast<std::size_t>(i)] = std::sqrt(q);
  }
  std::nth_element(norms.begin(), norms.begin() + nv / 2, norms.end());
  out.median_norm = norms[static_cast<std::size_t>(nv / 2)];

  // The attacker's side: the trained device blocks on the public images.
  auto be = backend::make_backend(st.backend);
  const auto spec = core::zoo_model(st.model, d.train.item, d.train.n_classes);
  core::stage blocks(*be, spec, 0, st.cut, s.seed);
  std::vector<float> p0, buffers;
  core::initial_values(spec, 0, spec.n_blocks(), s.seed, p0, buffers);
  protocol::install(blocks, result.global_params, buffers);
  const std::int64_t np = std::min<std::int64_t>(st.n_public, d.test.size());
  std::vector<std::int64_t> pub_idx(static_cast<std::size_t>(np));
  for (std::int64_t i = 0; i < np; ++i) pub_idx[static_cast<std::size_t>(i)] = i;
  std::vector<float> feats(static_cast<std::size_t>(np * dim));
  const std::int64_t mb = s.batch / std::max(1, s.micro_batches);
  core::rng noise(0x61747461636bULL);
  for (std::int64_t at = 0; at < np; at += mb) {
    const std::int64_t k = std::min(mb, np - at);
    std::vector<float> x(static_cast<std::size_t>(k * per));
    std::vector<std::int32_t> y(static_cast<std::size_t>(k));
    d.test.gather(pub_idx.data() + at, k, x.data(), y.data());
    core::tensor xt = be->empty(spec.input.batched(k));
    be->upload(xt, x.data());
    core::stage::context ctx;
    const core::tensor z = blocks.forward(xt, ctx, core::mode::train);
    if (z.numel() != k * dim) throw core::error("the attacker's activations do not match the device's");
    std::vector<float> zv(static_cast<std::size_t>(z.numel()));
    be->download(z, zv.data());
    if (st.clip > 0) privacy::clip_rows(zv, k, st.clip);
    if (st.noise > 0)
      for (float& e : zv) e += static_cast<float>(st.noise * st.clip * noise.normal());
    std::copy(zv.begin(), zv.end(), feats.begin() + at * dim);
  }
  // Every activation scaled to unit norm (the decoder then sees directions, which carry the
  // image; the same for the victim's).
  auto unit_rows = [&](std::vector<float>& v, std::int64_t rows) {
    for (std::int64_t i = 0; i < rows; ++i) {
      double q = 0;
      for (std::int64_t k = 0; k < dim; ++k) q += double(v[i * dim + k]) * v[i * dim + k];
      const double r = q > 0 ? 1.0 / std::sqrt(q) : 0.0;
      for (std::int64_t k = 0; k < dim; ++k) v[i * dim + k] = static_cast<float>(v[i * dim + k] * r);
    }
  };
  unit_rows(feats, np);
  unit_rows(victim, nv);
  const auto pub_img = images_of(d.test, pub_idx), truth = images_of(d.train, victim_idx);
  const decoder dec(feats, np, dim, pub_img, per, 1e-3);
  std::vector<float> mean_img(static_cast<std::size_t>(per), 0.0f);
  for (std::int64_t i = 0; i < np; ++i)
    for (std::int64_t k = 0; k < per; ++k) mean_img[k] += pub_img[i * per + k] / static_cast<float>(np);
  const int h = static_cast<int>(d.train.item[1]), w = static_cast<int>(d.train.item[2]);
  for (std::int64_t i = 0; i < nv; ++i) {
    const auto rec = dec.predict(&victim[i * dim]);
    out.psnr += psnr(rec.data(), &truth[i * per], per) / static_cast<double>(nv);
    out.ssim += ssim(rec.data(), &truth[i * per], h, w) / static_cast<double>(nv);
    out.floor_psnr += psnr(mean_img.data(), &truth[i * per], per) / static_cast<double>(nv);
  }
  if (st.noise > 0) {
    privacy::rdp_accountant acc;
    acc.add_gaussian(st.noise / 2.0, max_releases);
    out.epsilon = acc.epsilon(1e-5);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  setting base;
  base.data = "fashion-mnist";
  base.backend = "auto";
  std::string models = "lenet5,resnet8", cuts = "lenet5:1,3,6;resnet8:1,2", noise_list = "0.01,0.03,0.1",
              nopeek_list = "1,4";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--data")
      base.data = v;
    else if (a == "--backend")
      base.backend = v;
    else if (a == "--models")
      models = v;
    else if (a == "--cuts")
      cuts = v;
    else if (a == "--steps")
      base.steps = std::stoi(v);
    else if (a == "--public")
      base.n_public = std::stoi(v);
    else if (a == "--victims")
      base.n_victims = std::stoi(v);
    else if (a == "--clip")
      base.clip = std::stod(v);
    else if (a == "--noise")
      noise_list = v;
    else if (a == "--nopeek")
      nopeek_list = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);
  std::map<std::string, std::vector<int>> cut_of;
  for (const auto& part : split_list(cuts, ';')) {
    const auto colon = part.find(':');
    for (const auto& k : split_list(part.substr(colon + 1), ',')) cut_of[part.substr(0, colon)].push_back(std::stoi(k));
  }
  // (activation noise, NoPeek weight): none first, then each noise level, then each weight.
  std::vector<std::pair<double, double>> levels{{0, 0}};
  for (const auto& t : split_list(noise_list, ',')) levels.emplace_back(std::stod(t), 0);
  for (const auto& t : split_list(nopeek_list, ',')) levels.emplace_back(0, std::stod(t));
  const fs::path work = fs::temp_directory_path() / ("cleave-reconstruct-" + std::to_string(::getpid()));
  std::printf(
      "input reconstruction from device 1's cut activations (2 devices, %d steps; decoder fitted on %d public "
      "images; %d victim samples from the last steps)\n",
      base.steps, base.n_public, base.n_victims);
  std::printf("%-8s %4s %7s %-26s %7s %7s %10s %9s %10s\n", "model", "cut", "dim", "defence", "PSNR", "SSIM",
              "floor PSNR", "accuracy", "eps/round");
  for (const auto& model : split_list(models, ',')) {
    for (const int k : cut_of[model]) {
      double clip = base.clip;  // 0: the median norm of the cut's activations without the defence
      for (const auto& [sigma, weight] : levels) {
        setting st = base;
        st.model = model;
        st.cut = k;
        st.noise = sigma;
        st.clip = sigma > 0 ? clip : 0;
        st.nopeek = weight;
        const auto o = run(work, st);
        if (sigma == 0 && weight == 0 && clip <= 0) clip = o.median_norm;
        char name[64];
        if (sigma > 0)
          std::snprintf(name, sizeof name, "clip %.3g, noise %g", st.clip, sigma);
        else if (weight > 0)
          std::snprintf(name, sizeof name, "nopeek %g", weight);
        else
          std::snprintf(name, sizeof name, "none");
        std::printf("%-8s %4d %7lld %-26s %7.2f %7.3f %10.2f %9.4f %10s\n", model.c_str(), k,
                    static_cast<long long>(o.dim), name, o.psnr, o.ssim, o.floor_psnr, o.accuracy,
                    sigma > 0 ? std::to_string(o.epsilon).substr(0, 6).c_str() : "-");
        std::fflush(stdout);
      }
    }
  }
  std::error_code ec;
  fs::remove_all(work, ec);
  return 0;
}
