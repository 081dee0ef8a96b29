// Times one training step (forward + loss + backward) of LeNet-5 and ResNet-8 at batch 64 on
// the cuda backend and on a CPU peer (onednn, else reference) in one run, and prints the ratio.
// Without a usable GPU it says so and exits 0. --json FILE writes the figures for
// torch_bench.py, which measures the same networks in PyTorch on the same GPU.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "bench_nets.h"
#include "cleave/backend/registry.h"

namespace {

using namespace cleave;

struct timing {
  double ms_per_step = 0;
  int n_steps = 0;
};

// Warm-up steps (plans, algorithm search, allocator), then steps until `budget_s` has passed
// (at least `min_steps`), synchronising before reading the clock.
timing time_steps(core::backend& b, bench::net& m, int warmup, int min_steps, double budget_s) {
  for (int i = 0; i < warmup; ++i) m.step(b);
  b.synchronize();
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  int n = 0;
  double elapsed = 0;
  while (n < min_steps || elapsed < budget_s) {
    m.step(b);
    ++n;
    if (n >= min_steps) {  // sync only to decide whether to stop; the final sync counts anyway
      b.synchronize();
      elapsed = std::chrono::duration<double>(clock::now() - t0).count();
    }
    if (n >= 2000) break;
  }
  b.synchronize();
  elapsed = std::chrono::duration<double>(clock::now() - t0).count();
  return {elapsed * 1000.0 / n, n};
}

std::unique_ptr<bench::net> build(const std::string& which, core::backend& b, std::int64_t batch) {
  return which == "lenet5" ? bench::make_lenet5(b, batch) : bench::make_resnet8(b, batch);
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, peer, cuda_spec = "cuda";
  std::int64_t batch = 64;
  double budget = 1.0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--peer" && i + 1 < argc) {
      peer = argv[++i];
    } else if (a == "--batch" && i + 1 < argc) {
      batch = std::atoll(argv[++i]);
    } else if (a == "--seconds" && i + 1 < argc) {
      budget = std::atof(argv[++i]);
    } else if (a == "--tf32") {
      cuda_spec = "cuda:tf32";
    } else if (a == "--device" && i + 1 < argc) {
      cuda_spec = argv[++i];  // another backend in the GPU's place: checks the networks anywhere
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--json FILE] [--peer onednn|reference] [--batch N] [--seconds S] [--tf32] [--device SPEC]\n",
          argv[0]);
      return 2;
    }
  }
  bool have_cuda = false, have_onednn = false;
  std::string cuda_detail = "this build has no cuda backend";
  for (const auto& info : backend::list_backends()) {
    if (info.name == "cuda") {
      have_cuda = info.available;
      cuda_detail = info.detail;
    }
    if (info.name == "onednn") have_onednn = info.available;
  }
  if (!have_cuda && cuda_spec.rfind("cuda", 0) == 0) {
    std::printf("cuda_bench: no GPU present (%s); nothing measured\n", cuda_detail.c_str());
    return 0;
  }
  if (peer.empty()) peer = have_onednn ? "onednn" : "reference";

  try {
    auto gpu = backend::make_backend(cuda_spec);
    auto cpu = backend::make_backend(peer);
    std::printf("cuda_bench: %s vs %s (%s), batch %lld, one step = forward + loss + backward\n",
                gpu->device_name().c_str(), peer.c_str(), cpu->device_name().c_str(), static_cast<long long>(batch));
    std::printf("%-8s %12s %8s %12s %8s %10s\n", "net", (gpu->name() + " ms").c_str(), "steps", (peer + " ms").c_str(),
                "steps", "speedup");
    std::string json = "{\"batch\": " + std::to_string(batch) + ", \"tf32\": " +
                       (gpu->name() == "cuda" && cuda_spec.find("tf32") != std::string::npos ? "true" : "false") +
                       ", \"device\": \"" + gpu->device_name() + "\", \"peer\": \"" + peer + "\", \"results\": [";
    bool first = true;
    for (const std::string which : {"lenet5", "resnet8"}) {
      auto mg = build(which, *gpu, batch);
      const timing tg = time_steps(*gpu, *mg, 5, 20, budget);
      auto mc = build(which, *cpu, batch);
      const timing tc = time_steps(*cpu, *mc, 1, 2, budget);
      std::printf("%-8s %12.3f %8d %12.3f %8d %9.1fx\n", which.c_str(), tg.ms_per_step, tg.n_steps, tc.ms_per_step,
                  tc.n_steps, tc.ms_per_step / tg.ms_per_step);
      json += std::string(first ? "" : ", ") + "{\"net\": \"" + which +
              "\", \"cuda_ms\": " + std::to_string(tg.ms_per_step) +
              ", \"peer_ms\": " + std::to_string(tc.ms_per_step) + "}";
      first = false;
    }
    json += "]}\n";
    if (!json_path.empty()) std::ofstream(json_path) << json;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
