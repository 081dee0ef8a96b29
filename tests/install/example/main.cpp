// An app's own data source (two classes of sine waves), a model built in C++, local training
// on it; and the in-process federation's entry point, linked to show it resolves.
#include <cmath>
#include <cstdio>

#include "cleave/backend/registry.h"
#include "cleave/core/data_source.h"
#include "cleave/core/model_builder.h"
#include "cleave/core/trainer.h"
#include "cleave/federation/local_federation.h"

namespace {

// Class 0: a slow wave, class 1: a fast one; 1 channel of 32 readings.
class waves final : public cleave::core::data_source {
 public:
  std::int64_t size() const override { return 64; }
  cleave::core::shape sample_shape() const override { return {1, 1, 32}; }
  int class_count() const override { return 2; }
  std::vector<std::int32_t> labels() const override {
    std::vector<std::int32_t> y(64);
    for (int i = 0; i < 64; ++i) y[static_cast<std::size_t>(i)] = i % 2;
    return y;
  }
  void fetch(const std::int64_t* idx, std::int64_t n, float* x, std::int32_t* y) const override {
    for (std::int64_t i = 0; i < n; ++i) {
      const double f = idx[i] % 2 ? 0.4 : 0.1;
      for (int t = 0; t < 32; ++t)
        x[i * 32 + t] = static_cast<float>(std::sin(f * t + 0.1 * static_cast<double>(idx[i])));
      y[i] = static_cast<std::int32_t>(idx[i] % 2);
    }
  }
};

}  // namespace

int main() {
  cleave::core::model_builder b("waves", {1, 1, 32}, 2);
  b.conv2d(8, {1, 5}).relu().global_avg_pool().linear(2);
  const cleave::core::model_spec m = b.build();
  auto be = cleave::backend::make_backend("reference");
  cleave::core::train_config c;
  c.batch = 8;
  cleave::core::trainer t(*be, m, c);
  const waves data;
  for (int e = 0; e < 15; ++e) t.train_epoch(data, e, nullptr);
  const auto r = t.evaluate(data);
  std::printf("example: %s, %lld parameters, accuracy %.3f\n", m.name.c_str(), static_cast<long long>(m.n_params()),
              r.accuracy);
  auto run = &cleave::federation::run_local;  // links the whole stack
  return run != nullptr && r.accuracy > 0.6 ? 0 : 1;
}
