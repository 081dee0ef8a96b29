// The adaptive splitter's state as a checkpoint stores it: routes and the profile book written as
// text and read back to the same values, and malformed fields refused by name.
#include <doctest/doctest.h>

#include "../support/error_of.h"
#include "cleave/split/plan.h"
#include "cleave/split/profile_book.h"
#include "cleave/split/replan.h"

using namespace cleave;
using split::node_key;
using split::profile_book;
using testing::error_of;

namespace {

const core::model_spec& mlp() {
  static const core::model_spec m = core::zoo_model("mlp", core::shape{1, 8, 8}, 10);
  return m;
}

// A profile of every block with figures that text rounds easily (thirds, tiny and huge values).
split::node_profile profile_of(std::uint32_t id, double scale) {
  split::node_profile p;
  p.node_id = id;
  p.batch = 8;
  p.backend = "onednn";
  p.memory_budget_bytes = 12345678901234ULL;
  for (int i = 0; i < mlp().n_blocks(); ++i)
    p.blocks.push_back(
        {scale / 3.0 * (i + 1), scale * 1e-7 / 7.0, 4096ULL * static_cast<std::uint64_t>(i), 17, 1ULL << 40, 257});
  p.links.push_back({0, 123.456f, 1.0f / 3.0f * 1e9f});
  return p;
}

profile_book filled() {
  profile_book b(mlp(), 8, 2, false);
  b.set_profile({core::tier::server, 0}, profile_of(0, 0.001));
  b.set_profile({core::tier::device, 2}, profile_of(2, 0.04));
  b.set_profile({core::tier::edge, 7}, profile_of(7, 0.01));
  b.report_link({core::tier::device, 2}, {core::tier::server, 0}, 1.0 / 3000.0, 1.25e8 / 3.0);
  b.report_link({core::tier::server, 0}, {core::tier::device, 2}, 0.0007, 0);
  return b;
}

void check_same(const profile_book& a, const profile_book& b) {
  REQUIRE(a.profiles().size() == b.profiles().size());
  for (const auto& [k, p] : a.profiles()) {
    const auto& q = b.profiles().at(k);
    CHECK(q.node_id == p.node_id);
    CHECK(q.batch == p.batch);
    CHECK(q.backend == p.backend);
    CHECK(q.memory_budget_bytes == p.memory_budget_bytes);
    REQUIRE(q.blocks.size() == p.blocks.size());
    for (std::size_t i = 0; i < p.blocks.size(); ++i) {
      CHECK(q.blocks[i].forward_seconds == p.blocks[i].forward_seconds);  // the same bits
      CHECK(q.blocks[i].backward_seconds == p.blocks[i].backward_seconds);
      CHECK(q.blocks[i].param_bytes == p.blocks[i].param_bytes);
      CHECK(q.blocks[i].state_bytes == p.blocks[i].state_bytes);
      CHECK(q.blocks[i].saved_bytes == p.blocks[i].saved_bytes);
      CHECK(q.blocks[i].output_bytes == p.blocks[i].output_bytes);
    }
    REQUIRE(q.links.size() == p.links.size());
    for (std::size_t i = 0; i < p.links.size(); ++i) {
      CHECK(q.links[i].peer_id == p.links[i].peer_id);
      CHECK(q.links[i].rtt_us == p.links[i].rtt_us);
      CHECK(q.links[i].bandwidth_bytes_per_s == p.links[i].bandwidth_bytes_per_s);
    }
  }
  const auto la = a.links(), lb = b.links();
  REQUIRE(la.size() == lb.size());
  for (std::size_t i = 0; i < la.size(); ++i) {
    CHECK(lb[i].from == la[i].from);
    CHECK(lb[i].to == la[i].to);
    CHECK(lb[i].rtt_seconds == la[i].rtt_seconds);
    CHECK(lb[i].bytes_per_second == la[i].bytes_per_second);
  }
}

// The error of reading `meta` into a filled book (which must then be left as it was).
std::string read_error(const std::map<std::string, std::string>& meta) {
  profile_book b = filled();
  const std::string e = error_of([&] { b.read(meta, "book:"); });
  check_same(b, filled());
  return e;
}

std::map<std::string, std::string> written() {
  std::map<std::string, std::string> m;
  filled().write(m, "book:");
  return m;
}

}  // namespace

TEST_CASE("a route reads back from the text it prints in every plan shape") {
  const int n = 12;
  for (const bool u : {false, true})
    for (const bool e : {false, true}) {
      std::vector<int> cuts = e ? std::vector{2, 7} : std::vector{5};
      if (u) {
        cuts.push_back(11);
        if (e) cuts.push_back(11);
      }
      const auto r = split::make_route(u, e, cuts, n);
      CAPTURE(r.str());
      CHECK(split::parse_route(r.str(), n) == r);
    }
}

TEST_CASE("a malformed route is refused naming the text and the fault") {
  CHECK(error_of([] { split::parse_route("device[0,4) gpu[4,12)", 12); }) ==
        "route 'device[0,4) gpu[4,12)': expected a segment such as device[0,4)");
  CHECK(error_of([] { split::parse_route("device[0,4) server[5,12)", 12); }) ==
        "route 'device[0,4) server[5,12)': segment 1 starts at block 5, not where the one before it ends");
  CHECK(error_of([] { split::parse_route("device[0,4) server[4,10)", 12); }) ==
        "route 'device[0,4) server[4,10)': it ends at block 10, the model has 12");
  CHECK(error_of([] { split::parse_route("device[0,0) server[0,12)", 12); }).find("the device must hold") !=
        std::string::npos);
  CHECK(error_of([] { split::parse_route("server[0,4) device[4,12)", 12); }).find("needs 2 cuts") != std::string::npos);
  CHECK(error_of([] { split::parse_route("device[0,4) edge[4,12)", 12); }) ==
        "route 'device[0,4) edge[4,12)': 3-tier plan needs 2 cuts, got 1");
  CHECK(error_of([] { split::parse_route("device[0,4) server[4,8) edge[8,12)", 12); }) ==
        "route 'device[0,4) server[4,8) edge[8,12)': its tiers are not those of a route cleave runs");
  CHECK(error_of([] { split::parse_route("device[0,12)", 12); }) ==
        "route 'device[0,12)': a route has at least two segments");
  CHECK(error_of([] { split::parse_route("device[0,4)  server[4,12)", 12); }) ==
        "route 'device[0,4)  server[4,12)': expected a segment such as device[0,4)");
  CHECK(error_of([] { split::parse_route("device[0,4)", 12); }).find("route 'device[0,4)'") == 0);
  CHECK(error_of([] { split::parse_route("", 12); }) == "route '': a route has at least two segments");
}

TEST_CASE("the routes in force read back from their checkpoint fields, and a bad field is refused by name") {
  const int n = 12;
  const std::map<std::uint32_t, split::epoch_route> routes{{3, {split::make_route(false, false, {5}, n), 2}},
                                                           {17, {split::make_route(false, true, {2, 7}, n), 4}}};
  std::map<std::string, std::string> meta{{"plan_epoch", "4"}};
  split::write_routes(meta, routes);
  CHECK(meta.at("route:17") == "device[0,2) edge[2,7) server[7,12)");
  const auto back = split::read_routes(meta, n, false, 4);
  REQUIRE(back.size() == 2);
  CHECK(back.at(3).r == routes.at(3).r);
  CHECK(back.at(17).epoch == 4);
  CHECK(error_of([&] { split::read_routes(meta, n, false, 3); }) ==
        "route:17:epoch: plan 4 is not between 1 and the checkpoint's plan 3");
  CHECK(error_of([&] { split::read_routes(meta, n, true, 4); }) ==
        "route:17: device[0,2) edge[2,7) server[7,12) is not U-shaped, this run is");
  auto bad = meta;
  bad.erase("route:3:epoch");
  CHECK(error_of([&] { split::read_routes(bad, n, false, 4); }) == "route:3:epoch is missing");
  bad = meta;
  bad["route:x"] = "device[0,5) server[5,12)";
  CHECK(error_of([&] { split::read_routes(bad, n, false, 4); }) == "route:x: 'x' is not a count");
  bad = meta;
  bad["route:0"] = "device[0,5) server[5,12)";
  CHECK(error_of([&] { split::read_routes(bad, n, false, 4); }) == "route:0: device id 0 out of range");
}

TEST_CASE("the device blocks of several routes merge into sorted ranges, and a hop carrying the output stays exact") {
  const int n = 12;
  const auto a = split::make_route(true, false, {3, 9}, n), b = split::make_route(false, false, {2}, n),
             c = split::make_route(true, false, {4, 10}, n);
  const auto blocks = split::device_blocks({a, b, c});
  CHECK(split::ranges_text(blocks) == "[0,4) [9,12)");
  CHECK(split::device_blocks({}).empty());
  // Held by at least 2, and 3, of them.
  CHECK(split::ranges_text(split::device_blocks({a, b, c}, 2)) == "[0,3) [10,12)");
  CHECK(split::ranges_text(split::device_blocks({a, b, c}, 3)) == "[0,2)");
  CHECK(split::device_blocks({a, b}, 3).empty());
  // A move off the device, onto it, and a U-shape's top moving.
  CHECK(split::takes_off_device(split::make_route(false, false, {6}, n), b));
  CHECK_FALSE(split::takes_off_device(b, split::make_route(false, false, {6}, n)));
  CHECK(split::takes_off_device(a, split::make_route(true, false, {3, 10}, n)));
  CHECK_FALSE(split::takes_off_device(a, a));
  const std::vector<core::hop_codecs> int8(2, {core::codec::int8, core::codec::int8});
  CHECK(split::exact_output(a, int8) == int8);  // the U's top is on the device: no hop carries the output
  // Every block on the device: its one hop carries the model's output, f32.
  const auto all = split::make_route(false, false, {n}, n);
  CHECK(split::exact_output(all, {int8[0]}) == std::vector<core::hop_codecs>{core::hop_codecs{}});
}

TEST_CASE("a device's starting route keeps --min-device-blocks on it, and configured cuts that do not are refused") {
  const auto& m = mlp();
  CHECK(split::starting_route(m, false, false, {}, 4, "--cuts").end(0) >= 4);
  // mlp's first block (flatten) holds no parameters: two blocks at least carry a trained layer.
  CHECK(split::trained_bottom(m) == 2);
  CHECK(split::trained_bottom(core::zoo_model("lenet5", core::shape{1, 28, 28}, 10)) == 1);
  CHECK(error_of([&] { split::starting_route(m, false, false, {1}, 3, "--cuts"); }) ==
        "--cuts '1' keep 1 blocks on the device, fewer than --min-device-blocks 3");
  CHECK(error_of([&] {
          split::starting_route(m, false, false, {9}, 0, "--cuts");
        }).find("--cuts '9' for model 'mlp': ") == 0);
}

TEST_CASE("a profile book written as text reads back to the same profiles, links and problem") {
  const profile_book a = filled();
  std::map<std::string, std::string> meta{{"plan_epoch", "3"}, {"zzz", "other fields are left alone"}};
  a.write(meta, "book:");
  CHECK(meta.at("book:profile:device:2:batch") == "8");
  CHECK(meta.at("book:link:device:2>server:0").find(' ') != std::string::npos);
  profile_book b(mlp(), 8, 2, false);
  b.read(meta, "book:");
  check_same(a, b);
  std::string missing_a, missing_b;
  const std::vector<profile_book::device_entry> devs{{2, 0, false}};
  const auto pa = a.problem(devs, missing_a), pb = b.problem(devs, missing_b);
  REQUIRE(pa);
  REQUIRE(pb);
  CHECK(pb->devices[0].board.block_seconds == pa->devices[0].board.block_seconds);
  CHECK(pb->devices[0].link.rtt_seconds == pa->devices[0].link.rtt_seconds);
  CHECK(pb->devices[0].link.bytes_per_second == pa->devices[0].link.bytes_per_second);
  CHECK(pb->server.block_seconds == pa->server.block_seconds);
  CHECK(pb->server.forward_seconds == pa->server.forward_seconds);
  CHECK(pb->cut_bytes == pa->cut_bytes);
}

TEST_CASE("the book's problem gives every node's forward passes apart, scaled to a whole step") {
  const profile_book a = filled();
  std::string missing;
  const auto p = a.problem({{2, 0, false}}, missing);
  REQUIRE(p);
  // Profiled on micro-batches of 8 samples; a step is 2 of 8: twice the profiled time.
  const auto prof = profile_of(2, 0.04);
  const auto& board = p->devices[0].board;
  REQUIRE(board.forward_seconds.size() == prof.blocks.size());
  for (std::size_t i = 0; i < prof.blocks.size(); ++i) {
    CHECK(board.forward_seconds[i] == prof.blocks[i].forward_seconds * 2.0);
    CHECK(board.forward_seconds[i] <= board.block_seconds[i]);
  }
  CHECK(p->server.forward_seconds.size() == prof.blocks.size());
  CHECK_NOTHROW(split::validate(*p));
}

TEST_CASE("reading a book replaces what it held: an empty text gives an empty book") {
  profile_book b = filled();
  b.read({{"plan_epoch", "3"}}, "book:");
  CHECK(b.profiles().empty());
  CHECK(b.links().empty());
}

TEST_CASE("a malformed field of a stored book is refused by name and the book is left as it was") {
  auto m = written();
  m["book:profile:device:2:blocks"] = "1 2 3 4 5";
  CHECK(read_error(m) == "book:profile:device:2:blocks (block 0): 5 figures, not 6");
  m = written();
  m["book:profile:device:2:blocks"] = "0.001 abc 1 2 3 4";
  CHECK(read_error(m) == "book:profile:device:2:blocks (block 0): 'abc' is not a number");
  m = written();
  m["book:profile:device:2:blocks"] = "0.001 -1 1 2 3 4";
  CHECK(read_error(m) == "book:profile:device:2:blocks (block 0): -1 is not a finite, non-negative figure");
  m = written();
  m["book:profile:device:2:blocks"] = "0.001 nan 1 2 3 4";
  CHECK(read_error(m) == "book:profile:device:2:blocks (block 0): nan is not a finite, non-negative figure");
  m = written();
  m["book:profile:device:2:blocks"] = "0.001 0.002 1 2 3 4";
  CHECK(read_error(m) ==
        "book:profile:device:2: profile of device 2 has 1 blocks, not " + std::to_string(mlp().n_blocks()));
  m = written();
  m["book:profile:edge:7:batch"] = "0";
  CHECK(read_error(m) == "book:profile:edge:7: profile of edge 7 was timed on an empty batch");
  m = written();
  m["book:profile:edge:7:batch"] = "-8";
  CHECK(read_error(m) == "book:profile:edge:7:batch: '-8' is not a number");
  m = written();
  m.erase("book:profile:server:0:memory_budget");
  CHECK(read_error(m) == "book:profile:server:0:memory_budget is missing");
  m = written();
  m["book:profile:device:2:colour"] = "blue";
  CHECK(read_error(m) == "book:profile:device:2:colour: not a profile field");
  m = written();
  m["book:profile:gpu:2:batch"] = "8";
  CHECK(read_error(m) == "book:profile:gpu:2:batch: 'gpu:2' is not a node (such as device:2)");
  m = written();
  m["book:profile:device:x:batch"] = "8";
  CHECK(read_error(m) == "book:profile:device:x:batch: 'x' is not a number");
  m = written();
  m["book:profile:device:2:links"] = "0 1.5";
  CHECK(read_error(m) == "book:profile:device:2:links (link 0): 2 figures, not 3");
  m = written();
  m["book:link:device:2"] = "0.001 1e9";
  CHECK(read_error(m) == "book:link:device:2: not a link (such as device:2>server:0)");
  m = written();
  m["book:link:device:2>server:0"] = "0.001";
  CHECK(read_error(m) == "book:link:device:2>server:0: '0.001' is not 'rtt_seconds bytes_per_second'");
  m = written();
  m["book:link:device:2>server:0"] = "0.001 inf";
  CHECK(read_error(m) == "book:link:device:2>server:0: inf is not a finite, non-negative figure");
  m = written();
  m["book:frob"] = "1";
  CHECK(read_error(m) == "book:frob: not a field of the splitter's book");
}
