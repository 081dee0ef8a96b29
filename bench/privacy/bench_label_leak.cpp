// Label inference from the gradients a device sends up at its top cut in U-shaped plans (the
// server sees them; the labels never leave the device), against real cleave runs: a federation
// of two devices on threads of this process trains LeNet-5, and every gradient frame device 1
// sends is kept. Of the last round, per class (one class against the rest) the attacker scores
// every sample of a micro-batch by (a) its gradient's norm (the better of both orientations),
// (b) its cosine with the gradient of one sample of that class in the same micro-batch whose
// label it knows (Li et al., ICLR'22), and (c) a stronger attacker: the largest cosine with
// the gradients of the first 20 samples of the class in the round, all of whose labels it knows.
// Printed: the AUC of each score averaged over classes, and the final test accuracy, for each
// defence side by side, each the mean of --seeds runs (seeds 1..K: initial weights, partition
// and data order), the accuracy cost against the same seeds undefended.
// Defences: noise:S (--cut-gradient-noise S on the device), groups:G (--label-groups G on the
// server), equalise (--equalise-cut-gradients on the device), joined by '+' (groups:10+equalise).
// Usage: bench_label_leak [--data D] [--rounds R] [--steps N] [--defences LIST] [--seeds K] [--backend B]
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "capture.h"

namespace fs = std::filesystem;
using namespace cleave;

namespace {

// Mann-Whitney AUC of scores (positives above negatives), ties counting half.
double auc(std::vector<std::pair<double, bool>> s) {
  std::sort(s.begin(), s.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  double pos = 0, neg = 0, rank_sum = 0;
  for (std::size_t i = 0; i < s.size();) {
    std::size_t j = i;
    while (j < s.size() && s[j].first == s[i].first) ++j;
    const double mid = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2.0;
    for (std::size_t k = i; k < j; ++k)
      if (s[k].second) rank_sum += mid, ++pos;
    i = j;
  }
  neg = static_cast<double>(s.size()) - pos;
  if (pos == 0 || neg == 0) return 0.5;
  return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg);
}

struct outcome {
  double norm_auc = 0, cosine_auc = 0, known_auc = 0, accuracy = 0;
  std::size_t n_samples = 0;
};

struct defence {
  std::string name = "none";
  double noise = -1;      // --cut-gradient-noise
  int groups = 1;         // --label-groups
  bool equalise = false;  // --equalise-cut-gradients
};

// "none", or "noise:S", "groups:G", "equalise" joined by '+'.
defence parse_defence(const std::string& text) {
  defence d;
  d.name = text;
  if (text == "none") return d;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, '+');) {
    if (part == "equalise") {
      d.equalise = true;
      continue;
    }
    const auto colon = part.find(':');
    const std::string key = part.substr(0, colon), value = colon == std::string::npos ? "" : part.substr(colon + 1);
    std::size_t used = 0;
    try {
      if (key == "noise") {
        d.noise = std::stod(value, &used);
      } else if (key == "groups") {
        d.groups = std::stoi(value, &used);
      }
    } catch (const std::exception&) {
      used = 0;
    }
    if ((key != "noise" && key != "groups") || used == 0 || used != value.size())
      throw std::invalid_argument("defence '" + text +
                                  "': expected none, noise:S, groups:G, equalise or several joined by '+'");
  }
  return d;
}

// The attacker's known samples per class in the stronger attack (c).
constexpr std::size_t known_per_class = 20;

outcome run(const fs::path& work, const std::string& data, const std::string& backend, int rounds, int steps,
            const defence& def, std::uint64_t seed) {
  bench::frame_capture cap;
  auto c =
      bench::capturing_federation(work, "lenet5", data, backend, 2, rounds, steps, cap, [&](device::agent_config& a) {
        a.cut_gradient_noise = def.noise;
        a.equalise_cut_gradients = def.equalise;
        a.partition_seed = seed;
      });
  c.server.u_shape = true;
  c.server.seed = seed;
  c.server.label_groups = def.groups;
  const auto result = federation::run_local(c);
  outcome out;
  out.accuracy = result.rounds.back().test_accuracy;

  // Device 1's data stream: the labels of step s, micro-batch m, as the device drew them.
  const auto d = core::load_dataset(data);
  bench::sample_stream stream(d.train.size(), device::default_order_seed(seed, 1));
  auto label_at = [&](std::int64_t pos) { return d.train.y[static_cast<std::size_t>(stream.index_at(pos))]; };
  std::vector<std::vector<std::pair<double, bool>>> norm_scores(static_cast<std::size_t>(d.train.n_classes)),
      cos_scores(norm_scores.size()), known_scores(norm_scores.size());
  // (c): unit gradients of the first known_per_class samples of each class in the round.
  std::vector<std::vector<std::vector<double>>> known(norm_scores.size());
  const std::int64_t batch = c.server.batch;
  for (const auto& f : cap.frames) {
    auto m = bench::decode_captured(f);
    const auto* g = m.ok() ? m->as<wire::Gradients>() : nullptr;
    if (!g) continue;
    // Only the last round: what the attacker sees of a trained model.
    if (g->step() / static_cast<std::uint64_t>(steps) != static_cast<std::uint64_t>(rounds)) continue;
    const auto v = transport::view_of(*g->gradient());
    const auto vals = v.values<float>();
    const std::int64_t rows = v.shape[0], dim = static_cast<std::int64_t>(vals.size()) / rows;
    const std::int64_t first = (static_cast<std::int64_t>(g->step()) - steps) * batch + g->micro_batch() * rows;
    std::vector<int> y(static_cast<std::size_t>(rows));
    std::vector<double> norm(static_cast<std::size_t>(rows));
    for (std::int64_t i = 0; i < rows; ++i) {
      y[static_cast<std::size_t>(i)] = label_at(first + i);
      double s2 = 0;
      for (std::int64_t k = 0; k < dim; ++k) s2 += double(vals[i * dim + k]) * vals[i * dim + k];
      norm[static_cast<std::size_t>(i)] = std::sqrt(s2);
    }
    out.n_samples += static_cast<std::size_t>(rows);
    auto unit = [&](std::int64_t i) {
      std::vector<double> u(static_cast<std::size_t>(dim));
      const double nm = norm[static_cast<std::size_t>(i)];
      for (std::int64_t k = 0; k < dim; ++k) u[static_cast<std::size_t>(k)] = nm > 0 ? vals[i * dim + k] / nm : 0.0;
      return u;
    };
    bool learning = false;
    for (const auto& k : known) learning = learning || k.size() < known_per_class;
    if (learning) {
      // The attacker collects its known samples from the round's first micro-batches.
      for (std::int64_t i = 0; i < rows; ++i) {
        auto& k = known[static_cast<std::size_t>(y[static_cast<std::size_t>(i)])];
        if (k.size() < known_per_class) k.push_back(unit(i));
      }
    } else {
      for (std::int64_t i = 0; i < rows; ++i) {
        const auto u = unit(i);
        for (std::size_t cls = 0; cls < known.size(); ++cls) {
          double best = -2;
          for (const auto& r : known[cls]) {
            double dot = 0;
            for (std::size_t k = 0; k < u.size(); ++k) dot += u[k] * r[k];
            best = std::max(best, dot);
          }
          known_scores[cls].emplace_back(best, y[static_cast<std::size_t>(i)] == static_cast<int>(cls));
        }
      }
    }
    for (int cls = 0; cls < d.train.n_classes; ++cls) {
      auto& ns = norm_scores[static_cast<std::size_t>(cls)];
      for (std::int64_t i = 0; i < rows; ++i) ns.emplace_back(norm[static_cast<std::size_t>(i)], y[i] == cls);
      // The attacker knows one sample of the class in this micro-batch.
      const auto ref = std::find(y.begin(), y.end(), cls);
      if (ref == y.end()) continue;
      const std::int64_t r = ref - y.begin();
      for (std::int64_t i = 0; i < rows; ++i) {
        if (i == r) continue;
        double dot = 0;
        for (std::int64_t k = 0; k < dim; ++k) dot += double(vals[i * dim + k]) * vals[r * dim + k];
        const double den = norm[static_cast<std::size_t>(i)] * norm[static_cast<std::size_t>(r)];
        cos_scores[static_cast<std::size_t>(cls)].emplace_back(den > 0 ? dot / den : 0.0, y[i] == cls);
      }
    }
  }
  for (std::size_t cls = 0; cls < norm_scores.size(); ++cls) {
    const double a = auc(norm_scores[cls]);
    out.norm_auc += std::max(a, 1.0 - a) / static_cast<double>(norm_scores.size());
    out.cosine_auc += auc(cos_scores[cls]) / static_cast<double>(norm_scores.size());
    out.known_auc += auc(known_scores[cls]) / static_cast<double>(norm_scores.size());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = "fashion-mnist", backend = "auto",
              defence_list = "noise:0.25,noise:0.5,groups:4,groups:10,groups:4+noise:0.5,groups:10+noise:0.5";
  int rounds = 3, steps = 100, seeds = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--data")
      data = v;
    else if (a == "--backend")
      backend = v;
    else if (a == "--rounds")
      rounds = std::stoi(v);
    else if (a == "--steps")
      steps = std::stoi(v);
    else if (a == "--defences")
      defence_list = v;
    else if (a == "--seeds")
      seeds = std::max(1, std::stoi(v));
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);
  std::vector<defence> defences{defence{}};
  try {
    std::stringstream ss(defence_list);
    for (std::string t; std::getline(ss, t, ',');)
      if (t != "none") defences.push_back(parse_defence(t));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "--defences: %s\n", e.what());
    return 2;
  }
  const fs::path work = fs::temp_directory_path() / ("cleave-label-leak-" + std::to_string(::getpid()));
  std::printf(
      "label inference from the gradients device 1 sends up (U-shaped LeNet-5, 2 devices, %d rounds x %d "
      "steps, last round attacked, mean of %d seeds)\n",
      rounds, steps, seeds);
  std::printf("%-22s %9s %11s %10s %10s %8s\n", "defence", "norm AUC", "cosine AUC", "known-20", "accuracy", "cost");
  std::vector<double> base(static_cast<std::size_t>(seeds), 0.0);
  for (const defence& def : defences) {
    outcome mean;
    std::string per_seed;
    for (int k = 0; k < seeds; ++k) {
      const auto o = run(work, data, backend, rounds, steps, def, static_cast<std::uint64_t>(k + 1));
      if (def.name == "none") base[static_cast<std::size_t>(k)] = o.accuracy;
      mean.norm_auc += o.norm_auc / seeds;
      mean.cosine_auc += o.cosine_auc / seeds;
      mean.known_auc += o.known_auc / seeds;
      mean.accuracy += o.accuracy / seeds;
      mean.n_samples += o.n_samples;
      char one[48];
      std::snprintf(one, sizeof one, "%s%+.2f", per_seed.empty() ? "" : " ",
                    (o.accuracy - base[static_cast<std::size_t>(k)]) * 100.0);
      per_seed += one;
    }
    double base_mean = 0;
    for (const double b : base) base_mean += b / seeds;
    std::printf("%-22s %9.3f %11.3f %10.3f %10.4f %+8.2f  (%zu samples; per seed %s)\n", def.name.c_str(),
                mean.norm_auc, mean.cosine_auc, mean.known_auc, mean.accuracy, (mean.accuracy - base_mean) * 100.0,
                mean.n_samples, per_seed.c_str());
    std::fflush(stdout);
  }
  std::printf("target: AUC <= 0.6 with the defence at <= 1 point of accuracy\n");
  std::error_code ec;
  fs::remove_all(work, ec);
  return 0;
}
