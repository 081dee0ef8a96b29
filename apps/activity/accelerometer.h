// A seeded stand-in for a wearable's 3-axis accelerometer: windows of T readings at 50 Hz of six
// activities, each user with a gait, an orientation and an activity mix of their own, served
// as a cleave data source so that a device agent trains on it as on its own sensor.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cleave/core/data_source.h"

namespace activity {

enum class kind : int { walking, running, sitting, standing, stairs_up, stairs_down };
inline constexpr int n_activities = 6;
const char* name_of(kind k);

inline constexpr double sample_rate_hz = 50.0;

// What makes one user's signals theirs: cadence and vigour of their gait, how the device sits on
// them (a rotation of every axis), how noisy their sensor is, and which activities they do how
// often (the mix: non-IID by user).
struct user_profile {
  std::uint32_t id = 0;
  double freq_scale = 1.0;                 // gait frequency x
  double amp_scale = 1.0;                  // movement amplitude x
  std::array<double, 9> rotation{};        // device frame = rotation * body frame (row-major 3x3)
  double noise_scale = 1.0;                // sensor noise x
  std::array<double, n_activities> mix{};  // probability of each activity, sums to 1
};

// User `id` of a population drawn from `seed`; `mix_alpha` is the Dirichlet concentration of
// their activity mix (small: each user does few activities; large: all about equally).
// `balanced` gives an even mix instead (a held-out test population).
user_profile make_user(std::uint32_t id, std::uint64_t seed, double mix_alpha, bool balanced = false);

// n windows of each user, in user order; sample (3,1,T): axes x, y, z in g, T readings. Window
// i of a user is the same every time it is fetched (computed from (seed, user, i)).
class accelerometer_source final : public cleave::core::data_source {
 public:
  accelerometer_source(std::vector<user_profile> users, std::int64_t windows_per_user, int window_len,
                       std::uint64_t seed);

  std::int64_t size() const override { return static_cast<std::int64_t>(labels_.size()); }
  cleave::core::shape sample_shape() const override { return {3, 1, window_len_}; }
  int class_count() const override { return n_activities; }
  std::vector<std::int32_t> labels() const override { return labels_; }
  void fetch(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out) const override;
  std::string describe() const override;

  // One window into out (3 * T): what fetch writes for sample i.
  void window(std::int64_t i, float* out) const;

 private:
  std::vector<user_profile> users_;
  std::int64_t per_user_;
  int window_len_;
  std::uint64_t seed_;
  std::vector<std::int32_t> labels_;
};

}  // namespace activity
