#!/usr/bin/env bash
# The Debian package on this machine, end to end: built with CPack from BUILD_DIR, checked by
# lintian (no error or warning), installed with dpkg -i, its units checked by systemd-analyze
# verify, the installed binary run as user cleave with the installed example configurations for
# one round (a server and a device on loopback), then removed (only the configuration left, as
# Debian policy has it) and purged (nothing left).
# Usage: test_deb.sh BUILD_DIR. Needs root; exits 77 (skipped) without it or when a cleave
# package is already installed here (the test would replace it).
set -euo pipefail
build=$(cd "$1" && pwd)
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || skip "installing a package needs root"
for tool in dpkg dpkg-deb cpack systemd-analyze runuser lintian; do
  command -v "$tool" >/dev/null || skip "$tool is not installed"
done
state=$(dpkg-query -W -f='${db:Status-Status}' cleave 2>/dev/null || true)
case "$state" in
  '' | not-installed) ;;
  *) skip "a cleave package is on this machine ($state); remove it (dpkg -P cleave) to run this test" ;;
esac

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  # The nodes themselves (runuser's children) run as user cleave: nothing else of this test does.
  pkill -u cleave 2>/dev/null || true
  if [ -n "$(dpkg-query -W -f='${db:Status-Status}' cleave 2>/dev/null | grep -v not-installed)" ]; then
    rm -rf /etc/cleave/certs /etc/cleave/device-1
    dpkg -P cleave >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "== cpack"
cpack --config "$build/CPackConfig.cmake" -B "$work/pkg" >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log"; fail "cpack failed"; }
deb=$(ls "$work"/pkg/cleave_*.deb)
echo "$deb"
dpkg-deb -I "$deb"
[ "$(dpkg-deb -f "$deb" Package)" = cleave ] || fail "package name"
echo "== lintian"
lintian --tag-display-limit 0 "$deb" >"$work/lintian.log" 2>&1 || true
cat "$work/lintian.log"
! grep -E '^[EW]: ' "$work/lintian.log" >/dev/null || fail "lintian reports errors or warnings"
[ "$(dpkg-deb -f "$deb" Architecture)" = "$(dpkg --print-architecture)" ] || fail "architecture"
dpkg-deb -f "$deb" Depends | grep -q 'libssl3' || fail "Depends does not name libssl3: $(dpkg-deb -f "$deb" Depends)"
# A build with the CUDA backend also ships its plugin, loaded only where a CUDA backend is used.
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's#^\./#/#' | grep -v '/$' | grep -vx '/usr/lib/cleave/libcleave-cuda.so' |
  sort >"$work/files"
diff -u "$(dirname "$0")/package-files.txt" "$work/files" || fail "the package's files differ from package-files.txt"
dpkg-deb -e "$deb" "$work/control"
printf '/etc/cleave/server.toml\n/etc/cleave/edge.toml\n/etc/cleave/agent.toml\n' | diff -u - "$work/control/conffiles" ||
  fail "conffiles"
# Every command of `cleave --help` has its entry in the manual page.
dpkg-deb -x "$deb" "$work/root"
zcat "$work/root/usr/share/man/man1/cleave.1.gz" >"$work/cleave.1"
for cmd in $("$work/root/usr/bin/cleave" --help | awk '/^Subcommands:/ {on=1; next} on && !NF {exit} on {print $1}'); do
  grep -q "^\.B $cmd\$" "$work/cleave.1" || fail "the manual page has no entry for '$cmd'"
done

echo "== dpkg -i"
dpkg -i "$deb"
[ "$(dpkg-query -W -f='${db:Status-Status}' cleave)" = installed ] || fail "not installed"
getent passwd cleave | grep -q ':/var/lib/cleave:/usr/sbin/nologin$' || fail "account: $(getent passwd cleave)"
[ "$(stat -c '%U:%G %a' /var/lib/cleave)" = "cleave:cleave 750" ] || fail "/var/lib/cleave: $(stat -c '%U:%G %a' /var/lib/cleave)"
[ "$(stat -c '%G %a' /etc/cleave)" = "cleave 750" ] || fail "/etc/cleave: $(stat -c '%U:%G %a' /etc/cleave)"
[ "$(stat -c '%G %a' /etc/cleave/server.toml)" = "cleave 640" ] || fail "/etc/cleave/server.toml"
/usr/bin/cleave --help >/dev/null

echo "== systemd-analyze verify"
mkdir -p /etc/cleave/kit-1  # the working directory of the cleave-*@kit-1 units
units="cleave-server.service cleave-edge.service cleave-agent.service cleave-server@kit-1.service
  cleave-edge@kit-1.service cleave-agent@kit-1.service"
(cd /lib/systemd/system && systemd-analyze verify --man=no $units) >"$work/verify.log" 2>&1 ||
  { cat "$work/verify.log"; fail "systemd-analyze verify"; }
if grep -v '^$' "$work/verify.log"; then fail "systemd-analyze verify printed the lines above"; fi
rmdir /etc/cleave/kit-1
# The drop-in is what runs every unit as cleave, sandboxed: its exposure score says it applies
# (9.6 "UNSAFE" without it, 3.3 with it on systemd 252).
for u in $units; do
  line=$(systemd-analyze security --offline=yes "/lib/systemd/system/${u/@kit-1/@}" 2>/dev/null | tail -1)
  echo "$u: $line"
  score=$(echo "$line" | sed -n 's/.*: \([0-9.]*\) .*/\1/p')
  [ -n "$score" ] && awk -v s="$score" 'BEGIN {exit !(s <= 4.0)}' || fail "$u: exposure ${score:-unknown} > 4.0"
done

echo "== one round: the server with the installed configuration, the device from its startup kit"
port=
for _ in $(seq 50); do
  p=$((20000 + RANDOM % 30000))
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then port=$p; break; fi
done
[ -n "$port" ] || fail "no free loopback port"
mkdir "$work/project"
cat >"$work/project/project.toml" <<TOML
[project]
name = "package-test"
[[node]]
name = "server"
role = "server"
listen = "127.0.0.1:$port"
address = "127.0.0.1:$port"
[[node]]
name = "device-1"
role = "device"
TOML
/usr/bin/cleave provision "$work/project/project.toml" >/dev/null
# The server: /etc/cleave/server.toml as installed, its certificates in /etc/cleave/certs.
install -d -o cleave -g cleave -m 0700 /etc/cleave/certs
tar -xzf "$work/project/kits/server.tar.gz" -C "$work/project" server/certs
cp "$work/project/server/certs/"* /etc/cleave/certs/
chown cleave:cleave /etc/cleave/certs/*
# The device: its kit unpacked as cleave-agent@device-1.service reads it. Unpacked by root, the
# files go to user cleave, the key readable by it alone.
tar -xzf "$work/project/kits/device-1.tar.gz" -C /etc/cleave
[ "$(stat -c '%U %a' /etc/cleave/device-1/certs/device-1.key)" = "cleave 600" ] ||
  fail "the kit's key: $(stat -c '%U %a' /etc/cleave/device-1/certs/device-1.key)"
# As the units run them: user cleave, the configuration's directory as the working directory.
as_cleave() { (cd "$1" && shift && exec runuser -u cleave -- /usr/bin/cleave "$@"); }
as_cleave /etc/cleave --config /etc/cleave/server.toml server --listen "127.0.0.1:$port" --rounds 1 \
  --local-steps 5 >"$work/server.log" 2>&1 &
server=$!
pids+=("$server")
as_cleave /etc/cleave/device-1 --config /etc/cleave/device-1/agent.toml agent >"$work/agent.log" 2>&1 &
agent=$!
pids+=("$agent")
status=0
timeout 300 tail --pid="$server" -f /dev/null || status=$?
[ "$status" = 0 ] || { cat "$work/server.log"; fail "the server did not finish within 300 s"; }
wait "$server" || { cat "$work/server.log" "$work/agent.log"; fail "the server failed"; }
timeout 60 tail --pid="$agent" -f /dev/null || { cat "$work/agent.log"; fail "the agent did not stop"; }
wait "$agent" || { cat "$work/agent.log"; fail "the agent failed"; }
cat "$work/server.log"
grep -q 'training finished' "$work/server.log" || fail "no 'training finished' in the server's log"
[ "$(stat -c %U /var/lib/cleave/server.ckpt)" = cleave ] || fail "no checkpoint of user cleave in /var/lib/cleave"

echo "== two jobs: a long-running server and an agent that stays, as the units run them"
# The fleet's form of the same nodes: the server keeps jobs in /var/lib/cleave/jobs, the agent
# stays up between runs; an operator's certificate of the admin role submits the jobs.
/usr/bin/cleave certs issue admin --role admin --dir "$work/project/certs" >/dev/null
job() { /usr/bin/cleave job --certs "$work/project/certs" --name admin --server "127.0.0.1:$port" "$@"; }
printf 'rounds = 1\nlocal-steps = 5\nmin-devices = 1\n' >"$work/short.toml"
as_cleave /etc/cleave --config /etc/cleave/server.toml server --listen "127.0.0.1:$port" \
  --state /var/lib/cleave >"$work/jobs-server.log" 2>&1 &
server=$!
pids+=("$server")
as_cleave /etc/cleave/device-1 --config /etc/cleave/device-1/agent.toml agent --stay >"$work/jobs-agent.log" 2>&1 &
agent=$!
pids+=("$agent")
for _ in $(seq 100); do job list >/dev/null 2>&1 && break; sleep 0.2; done
for n in 1 2; do
  [ "$(job submit "$work/short.toml" 2>/dev/null)" = "$n" ] || { cat "$work/jobs-server.log"; fail "job $n not queued"; }
  for _ in $(seq 600); do job status "$n" 2>/dev/null | grep -q ': done' && break; sleep 0.5; done
  job status "$n" | grep -q ': done' || { cat "$work/jobs-server.log" "$work/jobs-agent.log"; fail "job $n not done"; }
done
job list
kill -0 "$server" && kill -0 "$agent" || fail "a node did not stay up between the jobs"
[ "$(stat -c %U /var/lib/cleave/jobs/2/model.ckpt)" = cleave ] ||
  { ls -laR /var/lib/cleave; cat "$work/jobs-server.log"; fail "no checkpoint of job 2 of user cleave"; }
# SIGTERM to the nodes themselves (user cleave's processes, runuser's children: runuser would pass
# a signal of its own on and end with it), as systemctl stop sends it to the service's process.
pkill -TERM -u cleave -x cleave
wait "$server" || { cat "$work/jobs-server.log"; fail "the job server did not exit 0 on SIGTERM"; }
wait "$agent" || { cat "$work/jobs-agent.log"; fail "the staying agent did not exit 0 on SIGTERM"; }

echo "== dpkg -r"
dpkg -r cleave
[ "$(dpkg-query -W -f='${db:Status-Status}' cleave)" = config-files ] || fail "not in state config-files"
while read -r f; do
  case "$f" in
    /etc/cleave/*) [ -f "$f" ] || fail "$f (configuration) went with dpkg -r" ;;
    *) [ ! -e "$f" ] || fail "$f is left after dpkg -r" ;;
  esac
done <"$work/files"
[ ! -e /lib/systemd/system/cleave-.service.d ] || fail "the drop-in directory is left"

echo "== dpkg -P"
rm -rf /etc/cleave/certs /etc/cleave/device-1  # not the package's: an administrator's
dpkg -P cleave
[ "$(dpkg-query -W -f='${db:Status-Status}' cleave 2>/dev/null || echo not-installed)" = not-installed ] ||
  fail "still known to dpkg after purge"
for f in /etc/cleave /var/lib/cleave; do [ ! -e "$f" ] || fail "$f is left after dpkg -P"; done
echo "PASS: the package builds, installs, runs a round, and removes cleanly"
