// `cleave certs init|issue|renew|revoke`: thin command-line layer over transport/certs.h.
#include "cmd_certs.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cleave/core/error.h"
#include "cleave/transport/certs.h"

namespace cleave::apps {

namespace {

struct init_args {
  std::string dir = "certs";
  std::string name = "cleave federation CA";
  int days = 3650;
  bool force = false;
};

struct issue_args {
  std::string dir = "certs";
  std::string out;
  std::string name;
  std::string role;
  int days = 365;
  std::vector<std::string> dns;
  std::vector<std::string> ips;
  std::uint32_t id = 0;
  bool force = false;
};

struct renew_args {
  std::string dir = "certs";
  std::string name;
  int days = 0;  // 0: as long as the previous certificate
  bool revoke_old = false;
};

struct revoke_args {
  std::string dir = "certs";
  std::string name;
  std::string cert;
  std::string reason = "unspecified";
};

// What the nodes must do to take a new revocation list in: the same on every path that writes one.
void print_revocation(const transport::revocation& r) {
  if (r.already) {
    std::cout << "certificate '" << r.name << "' (serial " << r.serial << ") was already revoked; " << r.crl.string()
              << " unchanged (" << r.n_revoked << " revoked)\n";
    return;
  }
  std::cout << "revoked certificate '" << r.name << "' (serial " << r.serial << ")\n"
            << "  revocation list " << r.crl.string() << " (" << r.n_revoked << " revoked)\n"
            << "  copy it to the certificate directory of every server and edge (and device), then send them SIGHUP:\n"
            << "  new handshakes with that certificate are refused, and its open sessions are closed\n";
}

void run_renew(const renew_args& a) {
  transport::renew_options opts;
  if (a.days) opts.valid_days = a.days;
  opts.revoke_previous = a.revoke_old;
  const auto r = transport::renew_certificate(a.dir, a.name, opts);
  const auto days =
      std::chrono::duration_cast<std::chrono::hours>(r.current.not_after - r.current.not_before).count() / 24;
  std::cout << "renewed " << core::tier_name(*r.current.role) << " '" << r.current.name << "'"
            << (r.current.node_id ? " (id " + std::to_string(*r.current.node_id) + ")" : "") << ": new key, serial "
            << r.current.serial << ", valid for " << days << " days\n"
            << "  certificate " << r.files.cert.string() << "\n"
            << "  key         " << r.files.key.string() << " (mode 0600)\n"
            << "  give both to the node (or rebuild its kit with `cleave provision`) and send it SIGHUP\n";
  if (r.revoked)
    print_revocation(*r.revoked);
  else
    std::cout << "  the previous certificate (serial " << r.previous.serial
              << ") stays valid until it expires; revoke it with --revoke-old or `cleave certs revoke --cert FILE`\n";
}

void run_revoke(const revoke_args& a) {
  const auto reason = transport::revocation_reason_from_name(a.reason);
  if (!reason) throw core::error("--reason '" + a.reason + "': unknown reason");
  if (a.name.empty() == a.cert.empty()) throw core::error("give a node NAME or --cert FILE (one of them)");
  if (!a.name.empty() && !transport::valid_node_name(a.name)) throw core::error("invalid node name '" + a.name + "'");
  const std::filesystem::path cert =
      a.cert.empty() ? std::filesystem::path(a.dir) / (a.name + ".crt") : std::filesystem::path(a.cert);
  print_revocation(transport::revoke_certificate(a.dir, cert, *reason));
}

void run_init(const init_args& a) {
  transport::ca_options opts;
  opts.name = a.name;
  opts.valid_days = a.days;
  opts.overwrite = a.force;
  const auto files = transport::init_ca(a.dir, opts);
  std::cout << "CA '" << a.name << "' valid for " << a.days << " days\n"
            << "  certificate " << files.cert.string() << "\n"
            << "  key         " << files.key.string() << " (mode 0600; keep it off the nodes)\n";
}

void run_issue(const issue_args& a) {
  const auto role = core::role_from_name(a.role);
  if (!role) throw core::error("unknown role '" + a.role + "': use server, edge, device or admin");
  transport::issue_options opts;
  opts.role = *role;
  opts.valid_days = a.days;
  opts.dns_names = a.dns;
  opts.ip_addresses = a.ips;
  opts.overwrite = a.force;
  if (a.id) opts.node_id = a.id;
  const auto id = a.id ? std::optional<std::uint32_t>(a.id) : transport::node_id_of(a.name, "");
  if (*role == core::tier::device && !id)
    throw core::error("device '" + a.name + "' needs an id: give --id N, or a name ending in -N (device-3)");
  const auto files = transport::issue_certificate(a.dir, a.name, opts, a.out);
  std::cout << a.role << " '" << a.name << "'" << (id ? " (id " + std::to_string(*id) + ")" : "") << " valid for "
            << a.days << " days\n"
            << "  certificate " << files.cert.string() << "\n"
            << "  key         " << files.key.string() << " (mode 0600)\n";
}

}  // namespace

void register_certs_command(CLI::App& app) {
  auto* certs = app.add_subcommand("certs", "Provision, renew and revoke the federation CA's node certificates");
  certs->require_subcommand(1);

  auto ia = std::make_shared<init_args>();
  auto* init = certs->add_subcommand("init", "Create the federation CA: DIR/ca.crt and DIR/ca.key");
  init->add_option("--dir", ia->dir, "Directory of the CA")->capture_default_str();
  init->add_option("--name", ia->name, "Common name of the CA")->capture_default_str();
  init->add_option("--days", ia->days, "Validity in days")->capture_default_str()->check(CLI::Range(1, 36500));
  init->add_flag("--force", ia->force, "Replace an existing CA (every node must then be reissued)");
  init->callback([ia] { run_init(*ia); });

  auto ua = std::make_shared<issue_args>();
  auto* issue = certs->add_subcommand("issue", "Issue a node key and certificate signed by the CA");
  issue->add_option("name", ua->name, "Node name: its identity on the wire ([A-Za-z0-9._-], up to 64)")->required();
  issue->add_option("--role", ua->role, "Role of the node")
      ->required()
      ->check(CLI::IsMember({"server", "edge", "device", "admin"}));
  issue->add_option("--dir", ua->dir, "Directory of the CA")->capture_default_str();
  issue->add_option("--out", ua->out, "Directory for NAME.crt and NAME.key (default: the CA directory)");
  issue->add_option("--days", ua->days, "Validity in days")->capture_default_str()->check(CLI::Range(1, 36500));
  issue->add_option("--dns", ua->dns, "Extra subjectAltName DNS entry (repeatable)");
  issue->add_option("--ip", ua->ips, "subjectAltName IP address (repeatable)");
  issue
      ->add_option("--id", ua->id,
                   "Node id bound into the certificate (a device's Hello must claim it; default: N of a name "
                   "ending in -N)")
      ->check(CLI::Range(1u, transport::max_node_id));
  issue->add_flag("--force", ua->force, "Replace an existing certificate and key");
  issue->callback([ua] { run_issue(*ua); });

  auto ra = std::make_shared<renew_args>();
  auto* renew = certs->add_subcommand(
      "renew", "Replace a node's key and certificate: same name, role, id and alt names; new serial and validity");
  renew->add_option("name", ra->name, "Node name (DIR/NAME.crt must exist)")->required();
  renew->add_option("--dir", ra->dir, "Directory of the CA and the node's certificate")->capture_default_str();
  renew->add_option("--days", ra->days, "Validity in days (default: that of the previous certificate)")
      ->check(CLI::Range(1, 36500));
  renew->add_flag("--revoke-old", ra->revoke_old,
                  "Put the previous certificate on the revocation list at once (reason superseded)");
  renew->callback([ra] { run_renew(*ra); });

  auto va = std::make_shared<revoke_args>();
  auto* revoke = certs->add_subcommand(
      "revoke", "Put a node's certificate on the CA's revocation list DIR/ca.crl (created or re-signed)");
  revoke->add_option("name", va->name, "Node name: revokes DIR/NAME.crt");
  revoke->add_option("--cert", va->cert, "Revoke this certificate file instead (one the CA issued)");
  revoke->add_option("--dir", va->dir, "Directory of the CA")->capture_default_str();
  revoke
      ->add_option("--reason", va->reason,
                   "unspecified, key-compromise, affiliation-changed, superseded, cessation-of-operation or "
                   "privilege-withdrawn")
      ->capture_default_str()
      ->check(CLI::IsMember({"unspecified", "key-compromise", "affiliation-changed", "superseded",
                             "cessation-of-operation", "privilege-withdrawn"}));
  revoke->callback([va] { run_revoke(*va); });
}

}  // namespace cleave::apps
