#!/usr/bin/env bash
# Install the anchors the bench compares seedgate with, where they are missing:
#   Debian: haproxy, nginx (+ stream and njs modules), squid, tinyproxy, openssh (sshd and ssh)
#   crates.io: rathole, into a bench-local root (default <workspace>/target/anchors; the harness
#   also looks in $BENCH_ANCHORS_ROOT, /tmp/bench-anchors and on PATH).
# Usage: bench/install-anchors.sh [--no-rathole] [--root DIR]
# Idempotent: an anchor that is already there is left alone. Needs root (or sudo) for apt-get.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="${BENCH_ANCHORS_ROOT:-$here/../target/anchors}"
rathole=1
while [ $# -gt 0 ]; do
  case "$1" in
    --no-rathole) rathole=0 ;;
    --root) root="$2"; shift ;;
    *) echo "usage: $0 [--no-rathole] [--root DIR]" >&2; exit 2 ;;
  esac
  shift
done

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

need=()
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
command -v nginx >/dev/null 2>&1 || need+=(nginx)
[ -e /usr/lib/nginx/modules/ngx_stream_module.so ] || need+=(libnginx-mod-stream)
[ -e /usr/lib/nginx/modules/ngx_stream_js_module.so ] || need+=(libnginx-mod-stream-js)
command -v squid >/dev/null 2>&1 || [ -x /usr/sbin/squid ] || need+=(squid)
command -v tinyproxy >/dev/null 2>&1 || need+=(tinyproxy)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v taskset >/dev/null 2>&1 || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  echo "install-anchors: apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends "${need[@]}"
  # The packages may start their daemons; the bench starts its own on other ports.
  for svc in nginx haproxy squid tinyproxy ssh; do
    $SUDO service "$svc" stop >/dev/null 2>&1 || true
  done
else
  echo "install-anchors: Debian anchors present"
fi

if [ "$rathole" = 1 ]; then
  if [ -x "$root/bin/rathole" ] || command -v rathole >/dev/null 2>&1; then
    echo "install-anchors: rathole present"
  else
    # rathole's default features need OpenSSL headers (native-tls) for its TLS transport.
    if ! pkg-config --exists openssl 2>/dev/null; then
      export DEBIAN_FRONTEND=noninteractive
      $SUDO apt-get install -y --no-install-recommends libssl-dev pkg-config
    fi
    echo "install-anchors: cargo install rathole --locked --root $root (a few minutes)"
    # rathole 0.5.0's lock file pins `time` 0.3.2x, which newer compilers reject (E0282);
    # then resolve the dependencies afresh (semver-compatible updates) instead.
    if ! cargo install rathole --locked --root "$root"; then
      echo "install-anchors: --locked build failed; retrying with freshly resolved dependencies"
      cargo install rathole --root "$root"
    fi
  fi
fi
