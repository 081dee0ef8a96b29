// Names, sets and wire sizes of the cut codecs (the encoders are in codec_kernels.cpp).
#include "cleave/core/codec.h"

#include <array>
#include <charconv>
#include <cmath>

#include "cleave/core/error.h"

namespace cleave::core {

namespace {
constexpr std::array<std::string_view, n_codecs> names = {"f32", "f16", "bf16", "int8", "topk"};
}

std::string_view codec_name(codec c) {
  const auto i = static_cast<std::size_t>(c);
  return i < names.size() ? names[i] : std::string_view{"?"};
}

std::optional<codec> codec_from_name(std::string_view name) {
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<codec>(i);
  return std::nullopt;
}

std::optional<codec> codec_from_int(std::uint32_t v) {
  if (v < static_cast<std::uint32_t>(n_codecs)) return static_cast<codec>(v);
  return std::nullopt;
}

bool codec_set::allows(codec c) const {
  for (codec a : allowed)
    if (a == c) return true;
  return false;
}

std::string codec_set::str() const {
  std::string out;
  for (codec c : allowed) {
    if (!out.empty()) out += ',';
    out += codec_name(c);
    if (c == codec::int8 && stochastic) out += ":stochastic";
    if (c == codec::topk) {
      char buf[32];
      const auto r = std::to_chars(buf, buf + sizeof buf, topk_fraction);
      out += ':' + std::string(buf, r.ptr);
      if (topk_feedback) out += ":feedback";
    }
  }
  return out;
}

namespace {

// "0.05", "feedback", "0.05:feedback" after "topk:".
void parse_topk_args(const std::string& whole, std::string_view args, codec_set& s) {
  while (true) {
    const std::size_t colon = std::min(args.find(':'), args.size());
    const std::string_view arg = args.substr(0, colon);
    if (arg == "feedback") {
      s.topk_feedback = true;
    } else {
      float f = 0;
      const auto r = std::from_chars(arg.data(), arg.data() + arg.size(), f);
      if (r.ec != std::errc{} || r.ptr != arg.data() + arg.size() || !(f > 0.0f && f <= 1.0f))
        throw error("codec list '" + whole + "': topk fraction '" + std::string(arg) + "' is not in (0, 1]");
      s.topk_fraction = f;
    }
    if (colon == args.size()) return;
    args = args.substr(colon + 1);
  }
}

}  // namespace

codec_set parse_codec_set(std::string_view text) {
  codec_set s;
  const std::string whole(text);
  if (text.empty()) throw error("codec list is empty (expected e.g. f32,f16,int8,topk:0.1)");
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    std::string_view item = text.substr(pos, comma - pos);
    pos = comma + 1;
    std::string_view arg;
    const auto colon = item.find(':');
    const bool has_arg = colon != std::string_view::npos;
    if (has_arg) {
      arg = item.substr(colon + 1);
      item = item.substr(0, colon);
    }
    const auto c = codec_from_name(item);
    if (!c)
      throw error("codec list '" + whole + "': unknown codec '" + std::string(item) +
                  "' (known: f32, f16, bf16, int8, topk)");
    if (has_arg) {
      if (c == codec::int8 && arg == "stochastic") {
        s.stochastic = true;
        if (!s.allows(*c)) s.allowed.push_back(*c);
        if (comma == text.size()) break;
        continue;
      }
      if (c != codec::topk)
        throw error("codec list '" + whole + "': '" + std::string(item) + ":" + std::string(arg) +
                    "': only topk takes a fraction or 'feedback', and int8 'stochastic'");
      parse_topk_args(whole, arg, s);
    }
    if (!s.allows(*c)) s.allowed.push_back(*c);
    if (comma == text.size()) break;
  }
  return s;
}

double encoded_bytes(codec c, double numel, double channels, float topk_fraction) {
  switch (c) {
    case codec::f32:
      return 4.0 * numel;
    case codec::f16:
    case codec::bf16:
      return 2.0 * numel;
    case codec::int8:
      return numel + 4.0 * std::max(1.0, channels);
    case codec::topk:
      return 8.0 *
             static_cast<double>(topk_count(static_cast<std::int64_t>(numel), topk_fraction));  // value + u32 position
  }
  return 4.0 * numel;
}

hop_codecs compact_codecs(const codec_set& s) {
  hop_codecs h;
  // Per value of a large tensor with many values per channel.
  const auto bytes = [&](codec c) { return encoded_bytes(c, 1 << 20, 64, s.topk_fraction); };
  for (codec c : s.allowed) {
    if (codec_for_activations(c) && bytes(c) < bytes(h.up)) h.up = c;
    if (bytes(c) < bytes(h.down)) h.down = c;
  }
  return h;
}

}  // namespace cleave::core
