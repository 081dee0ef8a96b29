// Option tables: each option of a command written once (name = config key, value, help, the typed
// field it sets), from which come its CLI11 flags, child command lines and the options reference.
#pragma once

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace cleave::apps {

enum class value_kind : std::uint8_t { flag, integer, number, text, list };

// What the docs say of one option, whatever settings it belongs to.
struct option_doc {
  std::string name, hint, help, default_text, env;
  value_kind kind = value_kind::text;
  bool required = false;
};

// One option of a command whose settings are an S (a node's typed configuration).
template <class S>
struct option {
  std::string name;  // the long option without its dashes; also its key in a [command] section
  std::string hint;  // what its value looks like: N, X, TEXT, HOST:PORT ("" for a flag)
  std::string help;
  value_kind kind = value_kind::text;
  bool required = false;
  std::string env;                         // an environment variable that sets it too
  std::optional<CLI::Validator> check;     // a range or set the value must be in
  std::function<void(CLI::Option*)> more;  // anything else CLI11 should know (bare values)
  // Registers the option on a command, bound to the field of s it sets: the text is parsed into
  // the typed value there, and a bad one named by the option.
  std::function<CLI::Option*(CLI::App&, S&, const std::string& help)> bind;
  // The field's value as this option's text (what bind reads back); {} when off or unset.
  std::function<std::vector<std::string>(const S&)> show;

  const std::string& key() const { return name; }
  std::string flag() const { return "--" + name; }
  option in(CLI::Validator v) && {
    check = std::move(v);
    return std::move(*this);
  }
  option needed() && {
    required = true;
    return std::move(*this);
  }
  option from_env(std::string var) && {
    env = std::move(var);
    return std::move(*this);
  }
};

template <class S>
using option_table = std::vector<option<S>>;

// The text of a typed value, as the option reads it back.
template <class T>
std::vector<std::string> text_of(const T& v) {
  if constexpr (std::is_same_v<T, bool>)
    return v ? std::vector<std::string>{"true"} : std::vector<std::string>{};
  else if constexpr (std::is_same_v<T, std::string>)
    return v.empty() ? std::vector<std::string>{} : std::vector<std::string>{v};
  else if constexpr (std::is_same_v<T, std::filesystem::path>)
    return v.empty() ? std::vector<std::string>{} : std::vector<std::string>{v.string()};
  else if constexpr (std::is_same_v<T, std::vector<std::string>>)
    return v;
  else
    return {fmt::format("{}", v)};
}

template <class T>
constexpr value_kind kind_of() {
  if constexpr (std::is_same_v<T, bool>)
    return value_kind::flag;
  else if constexpr (std::is_integral_v<T>)
    return value_kind::integer;
  else if constexpr (std::is_floating_point_v<T>)
    return value_kind::number;
  else if constexpr (std::is_same_v<T, std::vector<std::string>>)
    return value_kind::list;
  else
    return value_kind::text;
}

// An option that sets a field as it is (a number, a string, a path, a list of strings).
// `field` maps the settings to the field: [](S& s) -> auto& { return s.rounds; }.
template <class S, class F>
option<S> value(std::string name, std::string hint, std::string help, F field) {
  using T = std::remove_reference_t<decltype(field(std::declval<S&>()))>;
  static_assert(!std::is_same_v<T, bool>, "a bool field is a flag()");
  option<S> o{std::move(name), std::move(hint), std::move(help), kind_of<T>()};
  const std::string n = o.name;
  o.bind = [field, n](CLI::App& app, S& s, const std::string& help) {
    return app.add_option("--" + n, field(s), help);
  };
  o.show = [field](const S& s) { return text_of(field(const_cast<S&>(s))); };
  return o;
}

// A flag that sets a bool field to `when_given` (false for --no-X flags of a field on by default).
template <class S, class F>
option<S> flag(std::string name, std::string help, F field, bool when_given = true) {
  option<S> o{std::move(name), "", std::move(help), value_kind::flag};
  const std::string n = o.name;
  o.bind = [field, n, when_given](CLI::App& app, S& s, const std::string& help) {
    bool* b = &field(s);
    return app.add_flag_function(
        "--" + n, [b, when_given](std::int64_t count) { *b = count > 0 ? when_given : !when_given; }, help);
  };
  o.show = [field, when_given](const S& s) {
    return field(const_cast<S&>(s)) == when_given ? std::vector<std::string>{""} : std::vector<std::string>{};
  };
  return o;
}

// An option whose text (of CLI11 type V) is parsed into a typed value: set(s, v) stores it
// (throwing core::error naming the option on a bad one), show(s) writes it back as text.
template <class S, class V = std::string>
option<S> parsed(std::string name, std::string hint, std::string help,
                 std::type_identity_t<std::function<void(S&, const V&)>> set,
                 std::type_identity_t<std::function<std::vector<std::string>(const S&)>> show) {
  option<S> o{std::move(name), std::move(hint), std::move(help), kind_of<V>()};
  if (o.kind == value_kind::flag) o.kind = value_kind::text;
  const std::string n = o.name;
  o.bind = [set, n](CLI::App& app, S& s, const std::string& help) {
    S* p = &s;
    return app.add_option_function<V>(
        "--" + n, [set, p](const V& v) { set(*p, v); }, help);
  };
  o.show = std::move(show);
  return o;
}

// The option of table `from` (settings F) as an option of settings S, which hold an F at
// `part`: a command that passes an option on to a node (the demo) states it once, where the
// node does. An empty `help` keeps the node's.
template <class S, class F, class P>
option<S> passed_on(const option_table<F>& from, const std::string& name, P part, std::string help = {}) {
  for (const auto& f : from) {
    if (f.name != name) continue;
    option<S> o{f.name, f.hint, help.empty() ? f.help : std::move(help), f.kind, false, f.env, f.check, f.more};
    o.bind = [b = f.bind, part](CLI::App& app, S& s, const std::string& h) { return b(app, part(s), h); };
    o.show = [sh = f.show, part](const S& s) { return sh(part(const_cast<S&>(s))); };
    return o;
  }
  throw std::logic_error("no option --" + name + " to pass on");
}

// Adds every option of the table to a command, bound to s (which must outlive the command).
template <class S>
void add_options(CLI::App& app, const option_table<S>& table, S& s) {
  for (const auto& o : table) {
    const auto defaults = o.show(s);
    CLI::Option* opt = o.bind(app, s, o.help);
    if (o.kind != value_kind::flag && !o.required && defaults.size() == 1) opt->default_str(defaults.front());
    if (o.required) opt->required();
    if (!o.env.empty()) opt->envname(o.env);
    if (o.check) opt->check(*o.check);
    if (o.more) o.more(opt);
  }
}

// The arguments that make a command read settings s, given that it starts from `defaults`: one
// per option whose value differs (and every required one), in the table's order.
template <class S>
std::vector<std::string> command_line(const option_table<S>& table, const S& s, const S& defaults) {
  std::vector<std::string> args;
  for (const auto& o : table) {
    const auto v = o.show(s);
    if ((!o.required && v == o.show(defaults)) || v.empty()) continue;
    if (o.kind == value_kind::flag) {
      args.push_back(o.flag());
      continue;
    }
    for (const auto& x : v) args.insert(args.end(), {o.flag(), x});
  }
  return args;
}

// The table as the docs list it, defaults taken from `defaults`.
template <class S>
std::vector<option_doc> describe(const option_table<S>& table, const S& defaults) {
  std::vector<option_doc> out;
  for (const auto& o : table) {
    option_doc d{o.name, o.hint, o.help, "", o.env, o.kind, o.required};
    if (o.kind != value_kind::flag) {
      const auto v = o.show(defaults);
      for (std::size_t i = 0; i < v.size(); ++i) d.default_text += (i ? "," : "") + v[i];
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace cleave::apps
