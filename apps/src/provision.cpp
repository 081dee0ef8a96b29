// Provisioning a project: checks first, then the CA (once), node certificates, and the kits.
#include "provision.h"

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <set>
#include <sstream>

#include "cleave/core/atomic_file.h"
#include "cleave/core/error.h"
#include "cleave/transport/certs.h"
#include "cleave/transport/tls_context.h"
#include "tar_gz.h"

namespace cleave::apps {

namespace fs = std::filesystem;

namespace {

std::string date_of(std::chrono::system_clock::time_point t) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The host of "HOST:PORT", without IPv6 brackets.
std::string host_of(const std::string& address) {
  std::string h = address.substr(0, address.rfind(':'));
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  return h;
}

bool is_ip(const std::string& s) {
  unsigned char buf[16];
  return ::inet_pton(AF_INET, s.c_str(), buf) == 1 || ::inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

// The node's configuration file: provision's own keys, then the role's defaults the node does not
// set itself, then the node's options.
std::string config_of(const project& p, const node_spec& n) {
  const std::string cmd = command_of(n.role);
  std::ostringstream o;
  o << "# Configuration of node '" << n.name << "' (" << core::tier_name(n.role) << ") of project '" << p.name
    << "',\n# written by `cleave provision`. Start it from this directory: ./start.sh, which runs\n#   cleave --config "
    << cmd << ".toml " << cmd << "\n[" << cmd << "]\n";
  o << "certs = \"certs\"\n";
  o << "name = " << quoted(n.name) << "\n";
  if (n.id) o << "id = " << *n.id << "\n";
  if (n.role != core::tier::device) o << "listen = " << quoted(n.listen) << "\n";
  if (n.role != core::tier::server) {
    const node_spec& up = *p.find(n.upstream);
    if (n.role == core::tier::edge) {
      o << "server = " << quoted(up.address) << "\n";
      o << "server-name = " << quoted(up.name) << "\n";
    } else {
      o << "connect = " << quoted(up.address) << "\n";
      o << "upstream-name = " << quoted(up.name) << "\n";
    }
  }
  std::set<std::string> own;
  for (const auto& e : n.options) own.insert(e.key);
  if (const auto d = p.defaults.find(n.role); d != p.defaults.end())
    for (const auto& e : d->second)
      if (!own.count(e.key)) o << e.key << " = " << e.value << "\n";
  for (const auto& e : n.options) o << e.key << " = " << e.value << "\n";
  return o.str();
}

std::string start_script(const node_spec& n) {
  const std::string cmd = command_of(n.role);
  return "#!/bin/sh\n"
         "# Starts node '" +
         n.name + "' (cleave " + cmd +
         ") with the configuration beside this script. CLEAVE: the cleave\n"
         "# binary (default: cleave on PATH). More arguments go to `cleave " +
         cmd +
         "`. The node reloads its certificates\n"
         "# on SIGHUP (kill -HUP <pid>): the shell execs cleave, so this script's pid is the node's.\n"
         "set -e\n"
         "cd \"$(dirname \"$0\")\"\n"
         "exec \"${CLEAVE:-cleave}\" --config " +
         cmd + ".toml " + cmd + " \"$@\"\n";
}

std::string readme_of(const project& p, const node_spec& n, const transport::certificate_info& cert, bool has_crl) {
  const std::string cmd = command_of(n.role);
  std::ostringstream o;
  o << "cleave startup kit: node '" << n.name << "' (" << core::tier_name(n.role) << ") of project '" << p.name
    << "'\n\n";
  o << "Certificate serial " << cert.serial << ", valid until " << date_of(cert.not_after) << " (UTC)";
  if (n.id) o << "; node id " << *n.id;
  o << ".\n";
  if (n.role != core::tier::device)
    o << "It accepts connections on " << n.listen << "; the nodes below reach it at " << n.address << ".\n";
  if (n.role != core::tier::server) {
    const node_spec& up = *p.find(n.upstream);
    o << "It connects to '" << up.name << "' at " << up.address << ".\n";
  }
  std::vector<std::pair<std::string, std::string>> contents = {
      {"start.sh", "starts the node: cleave --config " + cmd + ".toml " + cmd},
      {cmd + ".toml", "its configuration ([" + cmd + "]: its name, addresses, certs = \"certs\")"},
      {"certs/ca.crt", "the federation CA's certificate"},
      {"certs/" + n.name + ".crt", "its certificate"},
      {"certs/" + n.name + ".key", "its private key (mode 0600; it never needs to leave this machine)"}};
  if (has_crl) contents.emplace_back("certs/ca.crl", "the CA's revocation list");
  std::size_t width = 0;
  for (const auto& c : contents) width = std::max(width, c.first.size());
  o << "\nContents\n";
  for (const auto& [file, what] : contents)
    o << "  " << file << std::string(width - file.size() + 2, ' ') << what << "\n";
  o << "\nStart (cleave installed, or CLEAVE=/path/to/cleave before the script)\n"
    << "  tar -xzf " << n.name << ".tar.gz && " << n.name << "/start.sh\n"
    << "\nAs a service (the cleave Debian package installed)\n"
    << "  tar -xzf " << n.name << ".tar.gz -C /etc/cleave\n"
    << "  systemctl enable --now cleave-" << cmd << "@" << n.name << ".service\n"
    << "  journalctl -u cleave-" << cmd << "@" << n.name << ".service -f\n"
    << "  Unpacked as root, the files belong to user cleave (the package creates it), the key readable\n"
    << "  by it alone. The unit runs cleave --config /etc/cleave/" << n.name << "/" << cmd << ".toml " << cmd << "\n"
    << "  in /etc/cleave/" << n.name << " (certs = \"certs\" is relative to it); /etc is read-only to it and\n"
    << "  /var/lib/cleave is its state directory. systemctl reload sends SIGHUP.\n"
    << "\nCertificates\n"
    << "  On SIGHUP the node reads its certificate, key, CA and revocation list again: new connections\n"
    << "  use them, open ones carry on, and sessions of peers the list now revokes are closed. A file\n"
    << "  that is missing or bad is refused with the reason in the log; the node keeps the ones it has.\n"
    << "  A renewed certificate (cleave certs renew) or a new revocation list (cleave certs revoke) is\n"
    << "  put in certs/ and followed by a SIGHUP. The node warns in its log from " << transport::expiry_warning_days
    << " days before its\n"
    << "  certificate expires.\n";
  return o.str();
}

std::vector<archive_entry> kit_entries(const project& p, const node_spec& n, const transport::certificate_info& info) {
  const fs::path crl = p.certs / std::string(transport::ca_crl_file);
  std::error_code ec;
  const bool has_crl = fs::exists(crl, ec);
  const std::string top = n.name;
  const std::string cmd = command_of(n.role);
  std::vector<archive_entry> e;
  e.push_back({top, "", 0755, true});
  e.push_back({top + "/README.txt", readme_of(p, n, info, has_crl), 0644, false});
  e.push_back({top + "/start.sh", start_script(n), 0755, false});
  e.push_back({top + "/" + cmd + ".toml", config_of(p, n), 0644, false});
  e.push_back({top + "/certs", "", 0700, true});
  e.push_back({top + "/certs/" + std::string(transport::ca_cert_file),
               core::read_file(p.certs / std::string(transport::ca_cert_file)), 0644, false});
  e.push_back({top + "/certs/" + n.name + ".crt", core::read_file(p.certs / (n.name + ".crt")), 0644, false});
  e.push_back({top + "/certs/" + n.name + ".key", core::read_file(p.certs / (n.name + ".key")), 0600, false});
  if (has_crl) e.push_back({top + "/certs/" + std::string(transport::ca_crl_file), core::read_file(crl), 0644, false});
  return e;
}

// An existing certificate of `n` must be the node the project describes, and usable.
void check_existing(const project& p, const node_spec& n) {
  const fs::path crt = p.certs / (n.name + ".crt"), key = p.certs / (n.name + ".key");
  const std::string renew = " (renew it: cleave certs renew " + n.name + " --dir " + p.certs.string() + ")";
  const auto info = transport::read_certificate_info(crt);
  if (info.role != n.role)
    throw core::error("node '" + n.name + "': its certificate " + crt.string() + " is for the " +
                      (info.role ? std::string(core::tier_name(*info.role)) : std::string("no")) +
                      " role, the project says " + std::string(core::tier_name(n.role)) +
                      " (a role cannot change: revoke it and give the node a new name)");
  if (n.role == core::tier::device && info.node_id != n.id)
    throw core::error("node '" + n.name + "': its certificate " + crt.string() + " binds device id " +
                      (info.node_id ? std::to_string(*info.node_id) : std::string("none")) + ", the project says " +
                      std::to_string(*n.id) + " (an id cannot change: revoke it and give the node a new name)");
  std::error_code ec;
  if (!fs::exists(key, ec)) throw core::error("node '" + n.name + "': " + crt.string() + " has no key " + key.string());
  try {
    transport::check_node_files(p.certs / std::string(transport::ca_cert_file), crt, key);
  } catch (const core::error& e) {
    throw core::error("node '" + n.name + "': " + e.what() + renew);
  }
}

}  // namespace

provision_report provision(const project& p, const provision_options& opts) {
  provision_report out;
  std::error_code ec;
  const fs::path ca_crt = p.certs / std::string(transport::ca_cert_file);
  const fs::path ca_key = p.certs / std::string(transport::ca_key_file);
  const bool have_crt = fs::exists(ca_crt, ec), have_key = fs::exists(ca_key, ec);
  if (have_crt != have_key)
    throw core::error("half a CA in " + p.certs.string() + ": " + (have_crt ? ca_crt : ca_key).string() + " without " +
                      (have_crt ? ca_key : ca_crt).string() +
                      " (restore the missing file; a new CA would invalidate every certificate it signed)");
  if (!have_crt && !opts.add.empty())
    throw core::error("no CA in " + p.certs.string() +
                      " to add nodes to: provision the project first (cleave provision " + p.file.string() + ")");

  std::vector<const node_spec*> targets;
  if (opts.add.empty()) {
    for (const auto& n : p.nodes) targets.push_back(&n);
  } else {
    for (const auto& name : opts.add) {
      const node_spec* n = p.find(name);
      if (!n) throw core::error("--add " + name + ": no node '" + name + "' in " + p.file.string());
      if (fs::exists(p.certs / (name + ".crt"), ec))
        throw core::error("--add " + name + ": node '" + name + "' is provisioned already (its certificate is " +
                          (p.certs / (name + ".crt")).string() + "; renew it with cleave certs renew)");
      for (const auto* t : targets)
        if (t == n) throw core::error("--add " + name + " is given twice");
      targets.push_back(n);
    }
  }

  // Everything checked before anything is written.
  std::set<std::string> revoked;
  if (have_crt) {
    for (const auto* n : targets) {
      const bool has_crt = fs::exists(p.certs / (n->name + ".crt"), ec);
      if (has_crt) check_existing(p, *n);
      if (!has_crt && fs::exists(p.certs / (n->name + ".key"), ec))
        throw core::error("node '" + n->name + "': " + (p.certs / (n->name + ".key")).string() +
                          " exists without its certificate (remove it to issue a new pair)");
    }
    for (const auto& r : transport::read_revocations(p.certs)) revoked.insert(r.serial);
    const auto ca = transport::read_certificate_info(ca_crt);
    out.ca = "the existing CA '" + ca.name + "' in " + p.certs.string() + " (valid until " + date_of(ca.not_after) +
             "); not re-minted";
  } else {
    transport::ca_options co;
    co.name = p.name + " CA";
    co.valid_days = p.ca_days;
    transport::init_ca(p.certs, co);
    out.new_ca = true;
    out.ca = "a new CA '" + co.name + "' in " + p.certs.string() + " (valid " + std::to_string(p.ca_days) +
             " days; ca.key never goes into a kit)";
  }

  fs::create_directories(p.kits, ec);
  if (ec) throw core::error("cannot create directory " + p.kits.string() + ": " + ec.message());
  const std::time_t now = std::time(nullptr);
  for (const auto* n : targets) {
    kit_report k;
    k.node = n->name;
    if (!fs::exists(p.certs / (n->name + ".crt"), ec)) {
      transport::issue_options io;
      io.role = n->role;
      io.valid_days = n->days.value_or(p.days);
      if (n->role == core::tier::device) io.node_id = n->id;
      io.dns_names = n->dns;
      io.ip_addresses = n->ip;
      if (!n->address.empty()) {
        const std::string host = host_of(n->address);
        if (is_ip(host))
          io.ip_addresses.push_back(host);
        else if (host != n->name)
          io.dns_names.push_back(host);
      }
      transport::issue_certificate(p.certs, n->name, io);
      k.new_certificate = true;
    }
    const auto info = transport::read_certificate_info(p.certs / (n->name + ".crt"));
    if (revoked.count(info.serial)) {
      k.note = "its certificate (serial " + info.serial + ") is revoked: no kit (cleave certs renew " + n->name +
               " gives it a new one)";
      out.nodes.push_back(k);
      continue;
    }
    k.kit = p.kits / (n->name + ".tar.gz");
    // The kit holds the node's private key: readable by its owner only.
    core::write_file_atomically(k.kit, tar_gz(kit_entries(p, *n, info), now), 0600);
    k.note = (k.new_certificate ? "new certificate" : "existing certificate") + std::string(", serial ") + info.serial +
             ", valid until " + date_of(info.not_after);
    out.nodes.push_back(k);
  }
  return out;
}

}  // namespace cleave::apps
