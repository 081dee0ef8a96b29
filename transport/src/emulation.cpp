// Parsing and querying emulated-heterogeneity schedules.
#include "cleave/transport/emulation.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "cleave/core/error.h"
#include "cleave/transport/channel.h"

namespace cleave::transport {

namespace {

constexpr const char* link_form = "'at ROUND link A B BANDWIDTH [LATENCY]'";
constexpr const char* slowdown_form = "'at ROUND slowdown NODE FACTOR'";
constexpr const char* bandwidth_units = "bit/s, kbit/s, Mbit/s or Gbit/s";
constexpr const char* latency_units = "us, ms or s";

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t\r\n");
  return s.substr(first, last - first + 1);
}

std::vector<std::string> split_words(std::string_view s) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    std::size_t j = i;
    while (j < s.size() && s[j] != ' ' && s[j] != '\t') ++j;
    if (j > i) out.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// The leading number of s and what follows it; false when s does not start with one.
bool leading_number(std::string_view s, double& value, std::string_view& rest) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), value);
  if (r.ec != std::errc() || r.ptr == s.data()) return false;
  rest = s.substr(static_cast<std::size_t>(r.ptr - s.data()));
  return true;
}

bool whole_number(std::string_view s) {
  double v = 0;
  std::string_view rest;
  return leading_number(s, v, rest) && rest.empty();
}

bool is_unit(std::string_view s) {
  for (const char* u : {"bit/s", "kbit/s", "Mbit/s", "Gbit/s", "us", "ms", "s"})
    if (iequals(s, u)) return true;
  return false;
}

// Joins a bare number with the unit written after it: "10 Mbit/s" -> "10Mbit/s".
std::vector<std::string> join_units(std::vector<std::string> words) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < words.size(); ++i) {
    if (i + 1 < words.size() && whole_number(words[i]) && is_unit(words[i + 1])) {
      out.push_back(words[i] + words[i + 1]);
      ++i;
    } else {
      out.push_back(words[i]);
    }
  }
  return out;
}

// Errors of one event: "schedule event '<text>'[ in '<file>']: <problem>".
struct event_error {
  std::string prefix;
  [[noreturn]] void operator()(const std::string& problem) const { throw core::error(prefix + problem); }
};

double parse_bandwidth(const std::string& s, const event_error& fail) {
  if (iequals(s, "unlimited")) return 0;
  double v = 0;
  std::string_view unit;
  if (!leading_number(s, v, unit))
    fail("bandwidth '" + s + "' is not a number with a unit (" + bandwidth_units + ") or 'unlimited'");
  if (unit.empty()) fail("bandwidth '" + s + "' has no unit (" + bandwidth_units + ")");
  double bits = 0;
  if (iequals(unit, "bit/s"))
    bits = 1;
  else if (iequals(unit, "kbit/s"))
    bits = 1e3;
  else if (iequals(unit, "Mbit/s"))
    bits = 1e6;
  else if (iequals(unit, "Gbit/s"))
    bits = 1e9;
  else
    fail("bandwidth '" + s + "' has an unknown unit '" + std::string(unit) + "' (" + bandwidth_units + ")");
  if (!std::isfinite(v) || !(v > 0)) fail("bandwidth '" + s + "' must be positive (or 'unlimited')");
  return v * bits / 8.0;
}

std::chrono::microseconds parse_latency(const std::string& s, const event_error& fail) {
  double v = 0;
  std::string_view unit;
  if (!leading_number(s, v, unit)) fail("latency '" + s + "' is not a number with a unit (" + latency_units + ")");
  if (unit.empty()) fail("latency '" + s + "' has no unit (" + latency_units + ")");
  double us = 0;
  if (iequals(unit, "us"))
    us = 1;
  else if (iequals(unit, "ms"))
    us = 1e3;
  else if (iequals(unit, "s"))
    us = 1e6;
  else
    fail("latency '" + s + "' has an unknown unit '" + std::string(unit) + "' (" + latency_units + ")");
  // An hour is far beyond any link worth emulating; the bound also keeps the cast in range.
  if (!std::isfinite(v) || v < 0 || v * us > 3.6e9) fail("latency '" + s + "' must be between 0 and an hour");
  return std::chrono::microseconds(std::llround(v * us));
}

emulation_event parse_event(std::string_view text, const std::string& file) {
  const event_error fail{"schedule event '" + std::string(text) + "'" + (file.empty() ? "" : " in '" + file + "'") +
                         ": "};
  const auto words = split_words(text);
  if (words.front() != "at") fail("an event starts with 'at ROUND', not '" + words.front() + "'");
  if (words.size() < 2) fail("missing round: expected " + std::string(link_form) + " or " + slowdown_form);
  emulation_event e;
  const std::string& round = words[1];
  const auto r = std::from_chars(round.data(), round.data() + round.size(), e.round);
  if (r.ec == std::errc::result_out_of_range) fail("round '" + round + "' is out of range");
  if (r.ec != std::errc() || r.ptr != round.data() + round.size()) fail("round '" + round + "' is not a number");
  if (e.round < 1) fail("round " + round + " is before the first round (rounds start at 1)");
  if (words.size() < 3) fail("missing event kind: expected " + std::string(link_form) + " or " + slowdown_form);

  const std::string& what = words[2];
  const std::vector<std::string> rest = join_units({words.begin() + 3, words.end()});
  if (what == "link") {
    e.what = emulation_event::kind::link;
    if (rest.size() < 3) fail("a link needs two node names and a bandwidth: " + std::string(link_form));
    if (rest.size() > 4) fail("unexpected '" + rest[4] + "' after the latency: " + link_form);
    e.a = rest[0];
    e.b = rest[1];
    if (e.a == e.b && e.a != "*") fail("a link needs two different ends, not '" + e.a + "' twice");
    e.caps.bytes_per_second = parse_bandwidth(rest[2], fail);
    // A link, not a shaper: bursts of at most about a millisecond at line rate (at least one
    // Ethernet frame) pass unpaced; everything else pays its serialization time.
    if (e.caps.bytes_per_second > 0)
      e.caps.burst_bytes = static_cast<std::size_t>(std::clamp(e.caps.bytes_per_second * 1e-3, 1500.0, 65536.0));
    if (rest.size() == 4) e.caps.latency = parse_latency(rest[3], fail);
  } else if (what == "slowdown") {
    e.what = emulation_event::kind::slowdown;
    if (rest.size() < 2) fail("a slowdown needs a node and a factor: " + std::string(slowdown_form));
    if (rest.size() > 2) fail("unexpected '" + rest[2] + "' after the factor: " + slowdown_form);
    e.a = rest[0];
    double f = 0;
    std::string_view tail;
    if (!leading_number(rest[1], f, tail) || !tail.empty()) fail("factor '" + rest[1] + "' is not a number");
    if (!std::isfinite(f)) fail("factor '" + rest[1] + "' is not a finite number");
    if (f < 1) fail("factor " + rest[1] + " is below 1 (a slowdown makes a node slower, never faster)");
    e.slowdown = f;
  } else {
    fail("unknown event kind '" + what + "' (expected 'link' or 'slowdown')");
  }
  return e;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

std::string emulation_event::str() const {
  std::string s = "round " + std::to_string(round) + ": ";
  if (what == kind::slowdown) return s + "slowdown " + a + " x" + number(slowdown);
  s += "link " + a + " <-> " + b + ": ";
  const double bits = caps.bytes_per_second * 8.0;
  if (caps.bytes_per_second <= 0)
    s += "unlimited";
  else if (bits >= 1e9)
    s += number(bits / 1e9) + " Gbit/s";
  else if (bits >= 1e6)
    s += number(bits / 1e6) + " Mbit/s";
  else if (bits >= 1e3)
    s += number(bits / 1e3) + " kbit/s";
  else
    s += number(bits) + " bit/s";
  const auto us = static_cast<double>(caps.latency.count());
  if (us >= 1e6)
    s += ", " + number(us / 1e6) + " s";
  else if (us >= 1e3 || us == 0)
    s += ", " + number(us / 1e3) + " ms";
  else
    s += ", " + number(us) + " us";
  return s;
}

bool name_matches(std::string_view pattern, std::string_view name) {
  return pattern == "*" || pattern == name;
}

std::vector<emulation_event> emulation_schedule::at(int round, std::string_view name) const {
  std::vector<emulation_event> out;
  for (const auto& e : events) {
    if (e.round != round) continue;
    if (e.what == emulation_event::kind::slowdown) {
      if (name_matches(e.a, name)) out.push_back(e);
      continue;
    }
    const bool at_a = name_matches(e.a, name), at_b = name_matches(e.b, name);
    if (!at_a && !at_b) continue;
    emulation_event turned = e;
    // `name` is the b end when only b matches, or when b names it and a is only the wildcard.
    if (!at_a || (e.a != name && e.b == name)) std::swap(turned.a, turned.b);
    out.push_back(std::move(turned));
  }
  return out;
}

emulation_schedule parse_schedule(const std::string& text_or_path) {
  std::string text = text_or_path, file;
  std::error_code ec;
  if (!text_or_path.empty() && text_or_path.find_first_of(";\n") == std::string::npos &&
      std::filesystem::is_regular_file(text_or_path, ec)) {
    std::ifstream in(text_or_path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    if (!in) throw core::error("schedule file '" + text_or_path + "': cannot be read");
    text = ss.str();
    file = text_or_path;
  } else if (text_or_path.find_first_of(";\n") == std::string::npos) {
    const auto words = split_words(text_or_path);
    if (!words.empty() && words.front() != "at" && words.size() == 1)
      throw core::error("schedule '" + text_or_path + "' is neither a file nor a schedule event ('at ROUND ...')");
  }
  emulation_schedule s;
  std::size_t line_start = 0;
  while (line_start <= text.size()) {
    std::size_t line_end = text.find('\n', line_start);
    if (line_end == std::string::npos) line_end = text.size();
    std::string_view line(text.data() + line_start, line_end - line_start);
    line = line.substr(0, line.find('#'));  // comment to the end of the line
    std::size_t i = 0;
    while (i <= line.size()) {
      std::size_t j = line.find(';', i);
      if (j == std::string_view::npos) j = line.size();
      const std::string_view event = trim(line.substr(i, j - i));
      if (!event.empty()) s.events.push_back(parse_event(event, file));
      i = j + 1;
    }
    line_start = line_end + 1;
  }
  std::stable_sort(s.events.begin(), s.events.end(),
                   [](const emulation_event& x, const emulation_event& y) { return x.round < y.round; });
  if (!s.events.empty()) s.text = text;
  return s;
}

link_schedule::link_schedule(emulation_schedule schedule, std::string node_name, std::string who)
    : schedule_(std::move(schedule)), name_(std::move(node_name)), who_(std::move(who)) {}

std::vector<emulation_event> link_schedule::advance(std::uint64_t round, const std::vector<peer>& open) {
  std::vector<emulation_event> others;
  if (schedule_.empty() || round <= round_) return others;
  for (std::uint64_t r = round_ + 1; r <= round; ++r)
    for (const auto& ev : schedule_.at(static_cast<int>(r), name_)) {
      spdlog::info("{}: {}", who_, ev.str());
      if (ev.what != emulation_event::kind::link) {
        others.push_back(ev);
        continue;
      }
      for (const auto& p : open)
        if (p.ch && name_matches(ev.b, p.name)) p.ch->emulate(ev.caps);
    }
  round_ = round;
  return others;
}

std::optional<link_caps> link_schedule::caps_for(const std::string& peer) const {
  std::optional<link_caps> caps;
  for (std::uint64_t r = 1; !schedule_.empty() && r <= std::max<std::uint64_t>(round_, 1); ++r)
    for (const auto& ev : schedule_.at(static_cast<int>(r), name_))
      if (ev.what == emulation_event::kind::link && name_matches(ev.b, peer)) caps = ev.caps;
  return caps;
}

void link_schedule::apply(channel& ch, const std::string& peer) const {
  if (const auto caps = caps_for(peer)) ch.emulate(*caps);
}

double link_schedule::start_slowdown(double otherwise) const {
  for (const auto& ev : schedule_.at(1, name_))
    if (ev.what == emulation_event::kind::slowdown) otherwise = ev.slowdown;
  return otherwise;
}

}  // namespace cleave::transport
