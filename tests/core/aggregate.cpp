// Aggregation rules: the mean is the weighted block average exactly; median and trimmed mean
// ignore one huge replica; clipping bounds every replica's update; bad rules are refused.
#include <doctest/doctest.h>

#include <cmath>

#include "../support/backend_harness.h"
#include "../support/error_of.h"
#include "cleave/split/aggregator.h"

using namespace cleave;
using core::shape;

namespace {

std::vector<float> slice(const std::vector<float>& v, std::int64_t from, std::int64_t to) {
  return {v.begin() + from, v.begin() + to};
}

double norm_of_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double sq = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    sq += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(sq);
}

}  // namespace

TEST_CASE("the mean rule equals the weighted block average exactly, parameters and state") {
  const auto m = core::zoo_model("resnet8", shape{1, 8, 8}, 10);
  const auto lay = core::layout_of(m);
  const int n = m.n_blocks();
  const auto np = lay.param_offset.back(), nb = lay.buffer_offset.back();
  REQUIRE(nb > 0);
  const int cut = n / 2;
  split::model_average want(m);
  split::aggregator got(m, split::aggregate_rule{});
  for (std::uint64_t r = 1; r <= 3; ++r) {
    const auto p = testing::random_vec(np, r), b = testing::random_vec(nb, 10 + r, 0.0f, 2.0f);
    const double w = 64.0 * static_cast<double>(r);
    // Replicas of the lower and the upper blocks, as a device and the server hold them.
    for (auto [first, end] : {std::pair{0, cut}, std::pair{cut, n}}) {
      const auto pp =
          slice(p, lay.param_offset[static_cast<std::size_t>(first)], lay.param_offset[static_cast<std::size_t>(end)]);
      const auto bb = slice(b, lay.buffer_offset[static_cast<std::size_t>(first)],
                            lay.buffer_offset[static_cast<std::size_t>(end)]);
      want.add(first, end, w, pp, bb);
      got.add(first, end, w, pp, bb);
    }
  }
  std::vector<float> wp(static_cast<std::size_t>(np)), wb(static_cast<std::size_t>(nb));
  std::vector<float> gp(wp.size()), gb(wb.size());
  want.mean_into(wp, wb);
  got.result_into(gp, gb);
  CHECK(gp == wp);
  CHECK(gb == wb);
  CHECK(got.weight(0) == want.weight(0));
  CHECK(got.n_replicas(0) == 3);
}

TEST_CASE("median and trimmed mean ignore one huge replica, the mean does not") {
  const auto m = core::zoo_model("mlp", shape{4}, 3);
  const auto np = core::layout_of(m).param_offset.back();
  const int n = m.n_blocks();
  std::vector<std::vector<float>> honest;
  for (std::uint64_t r = 1; r <= 4; ++r) honest.push_back(testing::random_vec(np, r));
  for (const float outlier : {1e30f, -1e30f}) {
    const std::vector<float> huge(static_cast<std::size_t>(np), outlier);
    for (const char* rule : {"median", "trimmed-mean:0.25", "mean"}) {
      CAPTURE(rule);
      CAPTURE(outlier);
      // Three honest replicas and the huge one (with weights that differ: ignored by the
      // median and the trimmed mean).
      split::aggregator agg(m, split::parse_aggregate(rule));
      for (std::size_t k = 0; k < 3; ++k) agg.add(0, n, 10.0 * static_cast<double>(k + 1), honest[k], {});
      agg.add(0, n, 1000, huge, {});
      std::vector<float> p(static_cast<std::size_t>(np)), none;
      agg.result_into(p, none);
      for (std::size_t i = 0; i < p.size(); ++i) {
        std::vector<float> v{honest[0][i], honest[1][i], honest[2][i]};
        std::sort(v.begin(), v.end());
        // Of four values one of which is an outlier, the middle two are honest: the upper two
        // honest values for a huge outlier, the lower two for a hugely negative one.
        const double mid =
            outlier > 0 ? (static_cast<double>(v[1]) + v[2]) / 2 : (static_cast<double>(v[0]) + v[1]) / 2;
        if (std::string(rule) == "mean") {
          CHECK(std::fabs(p[i]) > 1e28f);
        } else {
          CHECK(p[i] == doctest::Approx(mid).epsilon(1e-6));
        }
      }
    }
  }
}

TEST_CASE("a trimmed mean drops floor(F x n) values at each end: one of five at F = 0.2, none at F = 0.1") {
  const auto m = core::zoo_model("mlp", shape{4}, 3);
  const auto np = core::layout_of(m).param_offset.back();
  const int n = m.n_blocks();
  std::vector<std::vector<float>> honest;
  for (std::uint64_t r = 1; r <= 4; ++r) honest.push_back(testing::random_vec(np, r));
  const std::vector<float> huge(static_cast<std::size_t>(np), 1e30f);
  split::aggregator t2(m, split::parse_aggregate("trimmed-mean:0.2")),
      t1(m, split::parse_aggregate("trimmed-mean:0.1"));
  for (const auto& h : honest) {
    t2.add(0, n, 1, h, {});
    t1.add(0, n, 1, h, {});
  }
  t2.add(0, n, 1, huge, {});
  t1.add(0, n, 1, huge, {});
  std::vector<float> p2(static_cast<std::size_t>(np)), p1(p2.size()), none;
  t2.result_into(p2, none);
  t1.result_into(p1, none);
  for (std::size_t i = 0; i < p2.size(); ++i) {
    std::vector<float> v{honest[0][i], honest[1][i], honest[2][i], honest[3][i]};
    std::sort(v.begin(), v.end());
    CHECK(p2[i] == doctest::Approx((static_cast<double>(v[1]) + v[2] + v[3]) / 3).epsilon(1e-6));
    CHECK(p1[i] > 1e28f);
  }
}

TEST_CASE("a robust rule combines each block over the replicas that hold it and other blocks keep their values") {
  const auto m = core::zoo_model("mlp", shape{4}, 3);
  const auto lay = core::layout_of(m);
  const int n = m.n_blocks();
  REQUIRE(n >= 3);
  const auto np = lay.param_offset.back();
  const auto a = testing::random_vec(np, 1), b = testing::random_vec(np, 2), c = testing::random_vec(np, 3);
  const auto at = [&](int blk) { return lay.param_offset[static_cast<std::size_t>(blk)]; };
  split::aggregator med(m, split::parse_aggregate("median"));
  // Block 0 is nobody's; blocks [1, n-1) have three replicas, the last block one.
  med.add(1, n - 1, 1, slice(a, at(1), at(n - 1)), {});
  med.add(1, n, 1, slice(b, at(1), at(n)), {});
  med.add(1, n - 1, 1, slice(c, at(1), at(n - 1)), {});
  CHECK(med.n_replicas(0) == 0);
  CHECK(med.n_replicas(1) == 3);
  CHECK(med.n_replicas(n - 1) == 1);
  const std::vector<float> before(static_cast<std::size_t>(np), 7.0f);
  std::vector<float> p = before, none;
  med.result_into(p, none);
  for (auto i = at(0); i < at(1); ++i) CHECK(p[static_cast<std::size_t>(i)] == 7.0f);
  for (auto i = at(1); i < at(n - 1); ++i) {
    const auto k = static_cast<std::size_t>(i);
    std::vector<float> v{a[k], b[k], c[k]};
    std::sort(v.begin(), v.end());
    CHECK(p[k] == v[1]);
  }
  for (auto i = at(n - 1); i < np; ++i) CHECK(p[static_cast<std::size_t>(i)] == b[static_cast<std::size_t>(i)]);
}

TEST_CASE("clipping bounds every replica's update to the norm given, and leaves small updates as they are") {
  const auto m = core::zoo_model("mlp", shape{4}, 3);
  const auto np = core::layout_of(m).param_offset.back();
  const int n = m.n_blocks();
  const auto start = testing::random_vec(np, 1);
  const double c = 0.5;
  // One small update (norm 0.1) and one huge (every coordinate +1e6).
  auto small = start;
  small[0] += 0.1f;
  auto huge = start;
  for (auto& v : huge) v += 1e6f;
  {
    split::aggregator one(m, split::parse_aggregate("clip:0.5"), start, {});
    one.add(0, n, 64, huge, {});
    std::vector<float> p(static_cast<std::size_t>(np)), none;
    one.result_into(p, none);
    CHECK(norm_of_difference(p, start) <= c * (1 + 1e-4));
    CHECK(norm_of_difference(p, start) >= c * (1 - 1e-4));
  }
  {
    split::aggregator one(m, split::parse_aggregate("clip:0.5"), start, {});
    one.add(0, n, 64, small, {});
    std::vector<float> p(static_cast<std::size_t>(np)), none;
    one.result_into(p, none);
    for (std::size_t i = 0; i < p.size(); ++i) CHECK(p[i] == doctest::Approx(small[i]).epsilon(1e-6));
  }
  split::aggregator both(m, split::parse_aggregate("clip:0.5"), start, {});
  both.add(0, n, 64, small, {});
  both.add(0, n, 64, huge, {});
  std::vector<float> p(static_cast<std::size_t>(np)), none;
  both.result_into(p, none);
  // The mean of two updates of norm <= C is within C of the start.
  CHECK(norm_of_difference(p, start) <= c * (1 + 1e-4));
  // Without clipping the huge update dominates.
  split::aggregator mean(m, split::aggregate_rule{});
  mean.add(0, n, 64, small, {});
  mean.add(0, n, 64, huge, {});
  mean.result_into(p, none);
  CHECK(norm_of_difference(p, start) > 1e5);
}

TEST_CASE("aggregation rules read back as written, and bad ones are refused with the reason") {
  using testing::error_of;
  for (const char* text : {"mean", "median", "trimmed-mean:0.1", "trimmed-mean:0", "clip:5", "clip:0.25"}) {
    CAPTURE(text);
    CHECK(split::aggregate_name(split::parse_aggregate(text)) == text);
  }
  CHECK(split::parse_aggregate("trimmed-mean:0.2").kind == split::aggregate_kind::trimmed_mean);
  CHECK(split::parse_aggregate("trimmed-mean:0.2").fraction == 0.2);
  CHECK(split::parse_aggregate("clip:3").clip_norm == 3.0);
  CHECK(!split::parse_aggregate("mean").per_device());
  CHECK(split::parse_aggregate("median").per_device());
  const std::string unknown = "(known: mean, median, trimmed-mean:F, clip:C)";
  CHECK(error_of([] { split::parse_aggregate("average"); }) == "unknown aggregation 'average' " + unknown);
  CHECK(error_of([] { split::parse_aggregate("median:3"); }) == "unknown aggregation 'median:3' " + unknown);
  CHECK(error_of([] { split::parse_aggregate("trimmed-mean"); }) == "unknown aggregation 'trimmed-mean' " + unknown);
  CHECK(error_of([] { split::parse_aggregate(""); }) == "unknown aggregation '' " + unknown);
  CHECK(error_of([] { split::parse_aggregate("trimmed-mean:0.5"); }) == "trimmed-mean:F needs 0 <= F < 0.5, not 0.5");
  CHECK(error_of([] { split::parse_aggregate("trimmed-mean:-0.1"); }) == "trimmed-mean:F needs 0 <= F < 0.5, not -0.1");
  CHECK(error_of([] { split::parse_aggregate("trimmed-mean:nan"); }) == "trimmed-mean:F needs 0 <= F < 0.5, not nan");
  CHECK(error_of([] { split::parse_aggregate("trimmed-mean:"); }) == "'' in 'trimmed-mean:' is not a number");
  CHECK(error_of([] { split::parse_aggregate("clip:1x"); }) == "'1x' in 'clip:1x' is not a number");
  CHECK(error_of([] { split::parse_aggregate("clip:0"); }) == "clip:C needs a finite C > 0, not 0");
  CHECK(error_of([] { split::parse_aggregate("clip:-2"); }) == "clip:C needs a finite C > 0, not -2");
  CHECK(error_of([] { split::parse_aggregate("clip:inf"); }) == "clip:C needs a finite C > 0, not inf");
  CHECK(error_of([] { split::parse_aggregate("clip:nan"); }) == "clip:C needs a finite C > 0, not nan");
  // A rule built in code is checked too.
  split::aggregate_rule bad;
  bad.kind = split::aggregate_kind::clip;
  const auto m = core::zoo_model("mlp", shape{4}, 3);
  CHECK(error_of([&] { split::aggregator a(m, bad); }) == "clip:C needs a finite C > 0, not 0");
}
