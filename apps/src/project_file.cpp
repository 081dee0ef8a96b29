// Project files: TOML read with toml++ into [table]s and [[node]]s (KEY = string / integer /
// boolean / float / one-line array), then the checks of the project as a whole.
#include "project_file.h"

#include <arpa/inet.h>
#include <algorithm>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "cleave/core/error.h"
#include "cleave/transport/certs.h"
#include "toml_text.h"

namespace cleave::apps {

namespace fs = std::filesystem;

namespace {

struct value {
  enum class kind { string, integer, floating, boolean, array } what = kind::string;
  std::string text;  // a string's contents
  long long integer = 0;
  std::vector<value> items;
  std::string raw;  // as written
};

struct table {
  std::string name;  // "" (top level), "project", "server", "edge", "agent", "node"
  int line = 0;
  std::vector<std::pair<std::string, std::pair<value, int>>> keys;  // key -> value, line
};

// A project file's tables in the order they come, each key with its value and line.
class reader {
 public:
  explicit reader(fs::path file) : file_(std::move(file)) {}

  [[noreturn]] void fail(int line, const std::string& what) const {
    throw core::error(file_.string() + ": line " + std::to_string(line) + ": " + what);
  }

  std::vector<table> read() const {
    std::ifstream in(file_);
    if (!in) throw core::error("cannot read project file " + file_.string());
    std::stringstream text;
    text << in.rdbuf();
    toml::table root;
    try {
      root = parse_toml(text.str());
    } catch (const toml_error& e) {
      fail(e.line, e.what());
    }
    std::vector<table> out(1);
    for (const auto& [k, v] : in_file_order(root)) {
      const std::string name(k->str());
      const int line = line_of(*k);
      if (const auto* nodes = v->as_array(); nodes && nodes->is_array_of_tables() && !nodes->empty()) {
        if (name != "node") fail(line, "[[" + name + "]]: only nodes come as [[node]]");
        for (const auto& n : *nodes) out.push_back(table_of(name, line_of(n), *n.as_table()));
        continue;
      }
      if (const auto* t = v->as_table(); t && !t->is_inline()) {
        if (name == "node") fail(line, "[node]: write each node as [[node]]");
        if (name != "project" && name != "server" && name != "edge" && name != "agent")
          fail(line, "unknown table [" + name + "] (expected [project], [server], [edge], [agent] or [[node]])");
        out.push_back(table_of(name, line, *t));
        continue;
      }
      out.front().keys.emplace_back(name, std::pair{value_of(*v, name, line, true), line});
    }
    return out;
  }

 private:
  table table_of(const std::string& name, int line, const toml::table& t) const {
    table out{name, line, {}};
    for (const auto& [k, v] : in_file_order(t))
      out.keys.emplace_back(std::string(k->str()),
                            std::pair{value_of(*v, std::string(k->str()), line_of(*k), true), line_of(*k)});
    return out;
  }

  value value_of(const toml::node& n, const std::string& key, int line, bool top) const {
    value v;
    v.raw = toml_value_text(n);
    if (const auto* s = n.as_string()) {
      v.text = s->get();
    } else if (const auto* i = n.as_integer()) {
      v.what = value::kind::integer;
      v.integer = i->get();
    } else if (n.is_floating_point()) {
      v.what = value::kind::floating;
    } else if (n.is_boolean()) {
      v.what = value::kind::boolean;
    } else if (const auto* a = n.as_array(); a && top) {
      v.what = value::kind::array;
      for (const auto& x : *a) v.items.push_back(value_of(x, key, line, false));
    } else if (n.is_array()) {
      fail(line, "arrays inside arrays are not supported");
    } else {
      fail(line, "'" + key + "' is not a string, a number, true or false, or an array of them");
    }
    return v;
  }

  fs::path file_;
};

// "HOST:PORT" -> host, port (-1 when malformed).
std::pair<std::string, int> split_host_port(const std::string& s) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) return {"", -1};
  const std::string port = s.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return {"", -1};
  return {s.substr(0, colon), std::stoi(port)};
}

bool wildcard(const std::string& host) {
  return host == "0.0.0.0" || host == "::" || host == "[::]";
}

bool is_ip(const std::string& s) {
  unsigned char buf[16];
  return ::inet_pton(AF_INET, s.c_str(), buf) == 1 || ::inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

// What provision writes into each command's section itself.
const std::set<std::string>& written_keys(core::tier role) {
  static const std::set<std::string> server{"certs", "name", "listen"};
  static const std::set<std::string> edge{"certs", "name", "id", "listen", "server", "server-name"};
  static const std::set<std::string> agent{"certs", "name", "id", "connect", "upstream-name", "upstream-role"};
  return role == core::tier::server ? server : role == core::tier::edge ? edge : agent;
}

}  // namespace

const char* command_of(core::tier role) {
  return role == core::tier::server ? "server" : role == core::tier::edge ? "edge" : "agent";
}

const node_spec* project::find(const std::string& n) const {
  for (const auto& node : nodes)
    if (node.name == n) return &node;
  return nullptr;
}

project read_project(const fs::path& file, const option_check& has_option) {
  reader r(file);
  const auto tables = r.read();
  project p;
  p.file = file;
  const fs::path base = file.parent_path();
  p.certs = base / "certs";
  p.kits = base / "kits";

  const auto want = [&](const value& v, value::kind k, const char* what, int line, const std::string& key) {
    if (v.what != k) r.fail(line, "'" + key + "' must be " + what);
  };
  const auto days_of = [&](const value& v, int line, const std::string& key) {
    want(v, value::kind::integer, "a number of days", line, key);
    if (v.integer < 1 || v.integer > 36500) r.fail(line, "'" + key + "' must be 1 to 36500 days");
    return static_cast<int>(v.integer);
  };
  const auto option_entry = [&](core::tier role, const std::string& key, const value& v, int line,
                                const std::string& where) {
    const char* cmd = command_of(role);
    if (written_keys(role).count(key))
      r.fail(line, where + "'" + key + "' is written by cleave provision from the project (the node's name, id, " +
                       "listen, address and upstream)");
    if (!has_option(cmd, key)) r.fail(line, where + "'" + key + "' is not an option of `cleave " + cmd + "`");
    return config_entry{key, v.raw, line};
  };

  for (const auto& t : tables) {
    if (t.name.empty()) {
      if (!t.keys.empty())
        r.fail(t.keys.front().second.second,
               "'" + t.keys.front().first + "' outside any table (put it under [project])");
      continue;
    }
    if (t.name == "project") {
      for (const auto& [key, vl] : t.keys) {
        const auto& [v, line] = vl;
        if (key == "name") {
          want(v, value::kind::string, "a string", line, key);
          if (v.text.empty() || v.text.size() > 60) r.fail(line, "'name' must have 1 to 60 characters");
          // It is written into every kit's configuration (a comment line) and README: a line break
          // or another control character would start lines of its own there.
          if (std::any_of(v.text.begin(), v.text.end(),
                          [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
            r.fail(line, "'name' must not hold line breaks or other control characters");
          p.name = v.text;
        } else if (key == "certs" || key == "kits") {
          want(v, value::kind::string, "a path", line, key);
          if (v.text.empty()) r.fail(line, "'" + key + "' must not be empty");
          (key == "certs" ? p.certs : p.kits) = fs::path(v.text).is_absolute() ? fs::path(v.text) : base / v.text;
        } else if (key == "days") {
          p.days = days_of(v, line, key);
        } else if (key == "ca-days") {
          p.ca_days = days_of(v, line, key);
        } else {
          r.fail(line, "unknown key '" + key + "' in [project] (name, certs, kits, days, ca-days)");
        }
      }
      continue;
    }
    if (t.name != "node") {
      const core::tier role = t.name == "server" ? core::tier::server
                              : t.name == "edge" ? core::tier::edge
                                                 : core::tier::device;
      for (const auto& [key, vl] : t.keys) p.defaults[role].push_back(option_entry(role, key, vl.first, vl.second, ""));
      continue;
    }

    node_spec n;
    n.line = t.line;
    const value* role = nullptr;
    for (const auto& [key, vl] : t.keys)
      if (key == "name") {
        want(vl.first, value::kind::string, "a string", vl.second, key);
        n.name = vl.first.text;
      } else if (key == "role") {
        role = &vl.first;
        want(vl.first, value::kind::string, "server, edge or device", vl.second, key);
      }
    if (n.name.empty()) r.fail(t.line, "[[node]] without a name");
    if (!transport::valid_node_name(n.name))
      r.fail(t.line, "node name '" + n.name + "': use 1 to 64 of [A-Za-z0-9._-], starting with a letter or digit");
    const std::string where = "node '" + n.name + "': ";
    if (!role) r.fail(t.line, where + "no role (server, edge or device)");
    const auto tier = core::tier_from_name(role->text);
    if (!tier) r.fail(t.line, where + "unknown role '" + role->text + "' (server, edge or device)");
    n.role = *tier;
    for (const auto& [key, vl] : t.keys) {
      const auto& [v, line] = vl;
      if (key == "name" || key == "role") continue;
      const auto string_list = [&](std::vector<std::string>& out) {
        want(v, value::kind::array, "an array of strings", line, key);
        for (const auto& item : v.items) {
          if (item.what != value::kind::string) r.fail(line, where + "'" + key + "' must be an array of strings");
          out.push_back(item.text);
        }
      };
      if (key == "id") {
        want(v, value::kind::integer, "a number", line, key);
        if (n.role == core::tier::server) r.fail(line, where + "a server takes no id");
        if (v.integer < 1 || v.integer > transport::max_node_id)
          r.fail(line, where + "id must be 1 to " + std::to_string(transport::max_node_id));
        n.id = static_cast<std::uint32_t>(v.integer);
      } else if (key == "listen" || key == "address" || key == "upstream") {
        want(v, value::kind::string, "a string", line, key);
        (key == "listen" ? n.listen : key == "address" ? n.address : n.upstream) = v.text;
      } else if (key == "dns") {
        string_list(n.dns);
        static const std::regex dns_re(R"([A-Za-z0-9*]([A-Za-z0-9.-]*[A-Za-z0-9])?)");
        for (const auto& d : n.dns)
          if (!std::regex_match(d, dns_re)) r.fail(line, where + "'" + d + "' is not a DNS name");
      } else if (key == "ip") {
        string_list(n.ip);
        for (const auto& ip : n.ip)
          if (!is_ip(ip)) r.fail(line, where + "'" + ip + "' is not an IP address");
      } else if (key == "days") {
        n.days = days_of(v, line, key);
      } else {
        n.options.push_back(option_entry(n.role, key, v, line, where));
      }
    }
    if (p.find(n.name)) r.fail(t.line, "node '" + n.name + "' comes twice");
    p.nodes.push_back(std::move(n));
  }

  // The project as a whole.
  const auto fail = [&](const node_spec& n, const std::string& what) {
    r.fail(n.line, "node '" + n.name + "': " + what);
  };
  if (p.nodes.empty()) throw core::error(file.string() + ": no [[node]] in the project");
  const node_spec* server = nullptr;
  for (const auto& n : p.nodes)
    if (n.role == core::tier::server) {
      if (server) fail(n, "a second server (the first is '" + server->name + "'): a project has one");
      server = &n;
    }
  if (!server) throw core::error(file.string() + ": no node with role = \"server\"");
  std::map<std::uint32_t, const node_spec*> ids;
  for (auto& n : p.nodes) {
    if (n.role == core::tier::device && !n.id) {
      n.id = transport::node_id_of(n.name, "");
      if (!n.id) fail(n, "a device needs an id: give id = N, or a name ending in -N (device-3)");
    }
    if (n.role != core::tier::server) {
      const std::uint32_t id = n.id ? *n.id : 1000;  // an edge's default (`cleave edge --id`)
      if (const auto it = ids.find(id); it != ids.end())
        fail(n, "id " + std::to_string(id) + " is also node '" + it->second->name + "''s" +
                    (n.id ? "" : " (an edge without id takes 1000: give it one)"));
      ids[id] = &n;
    }
    if (n.role == core::tier::device) {
      if (!n.listen.empty() || !n.address.empty()) fail(n, "a device listens on nothing (no listen or address)");
    } else {
      if (n.listen.empty()) n.listen = n.role == core::tier::server ? "0.0.0.0:7000" : "0.0.0.0:7100";
      const auto [lh, lp] = split_host_port(n.listen);
      if (lp < 0 || lp > 65535) fail(n, "listen '" + n.listen + "': expected HOST:PORT");
      if (n.address.empty()) {
        if (wildcard(lh) || lp == 0)
          fail(n, "give address = \"HOST:PORT\", where the nodes below reach it (it listens on " + n.listen + ")");
        n.address = n.listen;
      }
      const auto [ah, ap] = split_host_port(n.address);
      if (ap < 1 || ap > 65535 || wildcard(ah)) fail(n, "address '" + n.address + "': expected HOST:PORT");
    }
    if (n.role == core::tier::server) {
      if (!n.upstream.empty()) fail(n, "a server has no upstream");
      continue;
    }
    if (n.upstream.empty()) n.upstream = server->name;
    const node_spec* up = p.find(n.upstream);
    if (!up) fail(n, "upstream '" + n.upstream + "' is not a node of the project");
    if (n.role == core::tier::edge && up->role != core::tier::server)
      fail(n, "an edge's upstream must be the server, not '" + up->name + "'");
    if (n.role == core::tier::device && up->role == core::tier::device)
      fail(n, "a device's upstream must be the server or an edge, not device '" + up->name + "'");
  }
  return p;
}

}  // namespace cleave::apps
