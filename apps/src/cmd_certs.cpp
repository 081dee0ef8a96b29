// `cleave certs init|issue`: thin command-line layer over transport/certs.h.
#include "cmd_certs.h"

#include <CLI/CLI.hpp>
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
  const auto role = core::tier_from_name(a.role);
  if (!role) throw core::error("unknown role '" + a.role + "': use server, edge or device");
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
  auto* certs = app.add_subcommand("certs", "Provision the federation CA and node certificates");
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
      ->check(CLI::IsMember({"server", "edge", "device"}));
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
}

}  // namespace cleave::apps
