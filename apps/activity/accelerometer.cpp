// The accelerometer simulator: per activity a gravity direction, a periodic movement (cadence,
// harmonics, the axes it moves along) and sensor noise; per user and per window their variations.
#include "accelerometer.h"

#include <cmath>
#include <numbers>

#include "cleave/core/error.h"
#include "cleave/core/random.h"

namespace activity {

namespace {

using vec3 = std::array<double, 3>;

// The signal model of an activity, in the body frame (z up, y forward), in g.
struct activity_model {
  const char* name;
  double freq;    // Hz, 0: no gait (still postures sway slowly instead)
  double amp;     // of the fundamental
  double h2, h3;  // 2nd and 3rd harmonics, relative to the fundamental
  vec3 gravity;   // where gravity points in the body frame (unit)
  vec3 motion;    // how much each axis moves
  double noise;   // standard deviation of the sensor noise
  double sway_freq, sway_amp;
};

constexpr std::array<activity_model, n_activities> models{{
    {"walking", 1.8, 0.30, 0.40, 0.10, {0.00, 0.10, 0.99}, {0.30, 0.45, 1.00}, 0.04, 0, 0},
    {"running", 2.7, 0.90, 0.50, 0.25, {0.00, 0.20, 0.98}, {0.40, 0.50, 1.00}, 0.08, 0, 0},
    {"sitting", 0.0, 0.00, 0.00, 0.00, {0.00, 0.82, 0.57}, {0.20, 0.20, 0.20}, 0.02, 0.20, 0.03},
    {"standing", 0.0, 0.00, 0.00, 0.00, {0.00, 0.05, 1.00}, {0.30, 0.30, 0.10}, 0.02, 0.35, 0.04},
    {"stairs_up", 1.5, 0.35, 0.80, 0.20, {0.00, 0.35, 0.94}, {0.20, 0.75, 0.80}, 0.05, 0, 0},
    {"stairs_down", 2.1, 0.55, 0.30, 0.60, {0.00, -0.20, 0.98}, {0.35, 0.40, 1.00}, 0.06, 0, 0},
}};

// Rotation by `angle` about the unit axis `u` (Rodrigues), row-major.
std::array<double, 9> rotation(vec3 u, double angle) {
  const double c = std::cos(angle), s = std::sin(angle), t = 1 - c;
  const double x = u[0], y = u[1], z = u[2];
  return {t * x * x + c,     t * x * y - s * z, t * x * z + s * y, t * x * y + s * z, t * y * y + c,
          t * y * z - s * x, t * x * z - s * y, t * y * z + s * x, t * z * z + c};
}

vec3 rotated(const std::array<double, 9>& r, const vec3& v) {
  return {r[0] * v[0] + r[1] * v[1] + r[2] * v[2], r[3] * v[0] + r[4] * v[1] + r[5] * v[2],
          r[6] * v[0] + r[7] * v[1] + r[8] * v[2]};
}

std::uint64_t window_seed(std::uint64_t seed, std::uint32_t user, std::int64_t i, std::uint64_t what) {
  return cleave::core::mix64(cleave::core::mix64(cleave::core::mix64(seed ^ what) + user) +
                             static_cast<std::uint64_t>(i));
}

}  // namespace

const char* name_of(kind k) {
  return models[static_cast<std::size_t>(k)].name;
}

user_profile make_user(std::uint32_t id, std::uint64_t seed, double mix_alpha, bool balanced) {
  cleave::core::rng r(cleave::core::mix64(seed * 1000003 + id));
  user_profile u;
  u.id = id;
  u.freq_scale = r.uniform(0.85f, 1.15f);
  u.amp_scale = r.uniform(0.75f, 1.25f);
  // The device sits up to 15 degrees off the body's axes, about an axis of its own.
  vec3 axis{r.normal(), r.normal(), r.normal()};
  const double len = std::sqrt(axis[0] * axis[0] + axis[1] * axis[1] + axis[2] * axis[2]);
  for (auto& a : axis) a /= len > 0 ? len : 1;
  u.rotation = rotation(axis, r.uniform(0.0f, 15.0f) * std::numbers::pi / 180.0);
  u.noise_scale = r.uniform(0.7f, 1.4f);
  double sum = 0;
  for (auto& m : u.mix) {
    m = balanced ? 1.0 : r.gamma(mix_alpha) + 1e-3;
    sum += m;
  }
  for (auto& m : u.mix) m /= sum;
  return u;
}

accelerometer_source::accelerometer_source(std::vector<user_profile> users, std::int64_t windows_per_user,
                                           int window_len, std::uint64_t seed)
    : users_(std::move(users)), per_user_(windows_per_user), window_len_(window_len), seed_(seed) {
  if (users_.empty() || per_user_ < 1) throw cleave::core::error("accelerometer: needs users and windows");
  if (window_len_ < 16) throw cleave::core::error("accelerometer: a window needs at least 16 readings");
  labels_.reserve(users_.size() * static_cast<std::size_t>(per_user_));
  for (const auto& u : users_)
    for (std::int64_t i = 0; i < per_user_; ++i) {
      cleave::core::rng r(window_seed(seed_, u.id, i, 1));
      double p = r.uniform(), acc = 0;
      int k = 0;
      for (; k < n_activities - 1; ++k)
        if (p < (acc += u.mix[static_cast<std::size_t>(k)])) break;
      labels_.push_back(k);
    }
}

std::string accelerometer_source::describe() const {
  return "accelerometer of " + std::to_string(users_.size()) + " user" + (users_.size() == 1 ? "" : "s");
}

void accelerometer_source::window(std::int64_t i, float* out) const {
  const user_profile& u = users_[static_cast<std::size_t>(i / per_user_)];
  const std::int64_t w = i % per_user_;
  const activity_model& m = models[static_cast<std::size_t>(labels_[static_cast<std::size_t>(i)])];
  cleave::core::rng r(window_seed(seed_, u.id, w, 2));
  const double two_pi = 2 * std::numbers::pi;
  const double f = m.freq * u.freq_scale * r.uniform(0.95f, 1.05f);
  const double amp = m.amp * u.amp_scale * r.uniform(0.9f, 1.1f);
  const double phase = r.uniform(0.0f, 1.0f) * two_pi, phase2 = r.uniform(0.0f, 1.0f) * two_pi;
  const double sway_phase = r.uniform(0.0f, 1.0f) * two_pi;
  // Each axis moves with its own lag behind the vertical one.
  const vec3 lag{r.uniform(0.0f, 1.0f) * two_pi, r.uniform(0.0f, 1.0f) * two_pi, 0.0};
  const double noise = m.noise * u.noise_scale;
  const auto T = static_cast<std::size_t>(window_len_);
  for (std::size_t t = 0; t < T; ++t) {
    const double s = static_cast<double>(t) / sample_rate_hz;
    vec3 body{};
    for (int a = 0; a < 3; ++a) {
      double v = m.gravity[static_cast<std::size_t>(a)];
      const double mo = m.motion[static_cast<std::size_t>(a)];
      const double l = lag[static_cast<std::size_t>(a)];
      if (m.freq > 0) {
        const double x = two_pi * f * s + phase + l;
        v += amp * mo * (std::sin(x) + m.h2 * std::sin(2 * x + phase2) + m.h3 * std::sin(3 * x));
      } else {
        v += m.sway_amp * mo * std::sin(two_pi * m.sway_freq * s + sway_phase + l);
      }
      body[static_cast<std::size_t>(a)] = v;
    }
    const vec3 dev = rotated(u.rotation, body);
    for (std::size_t a = 0; a < 3; ++a) out[a * T + t] = static_cast<float>(dev[a] + noise * r.normal());
  }
}

void accelerometer_source::fetch(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out) const {
  const auto per = static_cast<std::size_t>(3 * window_len_);
  for (std::int64_t j = 0; j < n; ++j) {
    window(idx[j], x_out + static_cast<std::size_t>(j) * per);
    y_out[j] = labels_[static_cast<std::size_t>(idx[j])];
  }
}

}  // namespace activity
