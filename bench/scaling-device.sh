#!/usr/bin/env bash
# `bench scaling` on a lent machine that has neither cargo nor haproxy/nginx, from a folder
# prepared on a machine that has them.
#
#   bench/scaling-device.sh --prepare [DIR]   # here: build and gather everything into DIR
#                                             # (default devcarry/, not committed)
#   bench/scaling-device.sh [DIR]             # there, from the repository root: run it, write
#                                             # everything under $OUT (default scaling-out/)
#
# DIR holds carry.tar.gz (unpacked into a temporary directory there): bin/ (bench, sni-router,
# proxy-server, proxy-agent, taskset; release builds, stripped) and anchors/ (the Debian haproxy,
# nginx, libnginx-mod-stream(-js) packages unpacked with dpkg -x, and the shared libraries they
# load that are not glibc's, found with ldd). The anchors run with LD_LIBRARY_PATH on those
# libraries only; the machine needs glibc >= 2.36.
#
# The run: N = 1, 2, 4, ... up to half the CPUs this process may use (bench decides from the
# CPUs, nothing here assumes a count; SCALING_CPUS=1,2,4 chooses), one repeat of 2 s windows
# (SCALING_WINDOW, SCALING_REPEATS), stopped cleanly (what was measured is still written) after
# SCALING_LIMIT seconds (default 400). Besides bench's results it writes what the machine is and
# checks that sni-router sizes its runtime to a cgroup v2 cpu.max quota and to its affinity.
# At most 8 files land in $OUT: scaling.md, scaling.json, scaling.svg, bench.log, machine.txt,
# runtime.txt, logs.tar.gz (every config and process log of the run).
set -euo pipefail

prepare() {
  local out=${1:-devcarry} ws dir
  ws=$(cd "$(dirname "$0")/.." && pwd)
  local target=${CARGO_TARGET_DIR:-$ws/target}
  (cd "$ws" && cargo build --release -p sni-router -p proxy-server -p proxy-agent -p bench)
  dir=$(mktemp -d)
  mkdir -p "$dir/bin" "$dir/anchors" "$dir/debs"
  for b in bench sni-router proxy-server proxy-agent; do
    cp "$target/release/$b" "$dir/bin/"
    strip "$dir/bin/$b"
  done
  cp "$(command -v taskset)" "$dir/bin/"
  (cd "$dir/debs" && apt-get download haproxy nginx libnginx-mod-stream libnginx-mod-stream-js)
  for deb in "$dir"/debs/*.deb; do dpkg -x "$deb" "$dir/anchors"; done
  rm -rf "$dir/debs" "$dir/anchors/usr/share" "$dir/anchors/etc" "$dir/anchors/var" "$dir/anchors/lib/systemd"
  local libdir="$dir/anchors/usr/lib/$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)"
  mkdir -p "$libdir"
  # Every library the binaries and modules load, but glibc's own (the machine has a new enough one).
  ldd "$dir/anchors/usr/sbin/haproxy" "$dir/anchors/usr/sbin/nginx" "$dir"/anchors/usr/lib/nginx/modules/*.so |
    awk '/=> \// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv|libutil|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$libdir/"; done
  strip --strip-unneeded "$libdir"/*.so* 2>/dev/null || true
  # The anchors, from the folder and with a clean environment, as the lent machine will run them.
  env -i LD_LIBRARY_PATH="$libdir" "$dir/anchors/usr/sbin/haproxy" -v | head -1
  env -i LD_LIBRARY_PATH="$libdir" "$dir/anchors/usr/sbin/nginx" -V 2>&1 | head -1
  rm -rf "$out"
  mkdir -p "$out"
  tar -czf "$out/carry.tar.gz" -C "$dir" bin anchors
  rm -rf "$dir"
  du -sh "$out"
  echo "scaling-device: $out ready; on the lent machine run: bench/scaling-device.sh $out"
}

run() {
  local carry=${1:-devcarry} dir
  dir=$(mktemp -d)
  tar -xzf "$carry/carry.tar.gz" -C "$dir"
  local out=${OUT:-scaling-out}
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  export PATH="$dir/bin:$PATH" SEEDGATE_BIN_DIR="$dir/bin" BENCH_ANCHORS_ROOT="$dir/anchors"
  # Enough descriptors for bench's 20,000 and the systems' (root may raise the hard limit).
  ulimit -Hn 65536 2>/dev/null || true
  ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" || true

  {
    echo "== date"; date -u
    echo "== uname"; uname -a
    echo "== cpus (this process may use)"; nproc; grep -m1 'model name' /proc/cpuinfo || true
    echo "== lscpu"; lscpu 2>/dev/null || cat /proc/cpuinfo | head -30
    echo "== memory"; head -3 /proc/meminfo
    echo "== cgroup"; cat /proc/self/cgroup; cat /sys/fs/cgroup/cpu.max 2>/dev/null || true
    echo "== limits"; ulimit -n; ulimit -Hn
    echo "== sysctl"
    for k in net.core.somaxconn net.ipv4.tcp_max_syn_backlog net.ipv4.ip_local_port_range \
             net.ipv4.tcp_tw_reuse net.core.netdev_max_backlog net.ipv4.tcp_fin_timeout; do
      printf '%s = %s\n' "$k" "$(sysctl -n "$k" 2>/dev/null || echo '?')"
    done
    echo "== anchors"
    LD_LIBRARY_PATH="$dir/anchors/usr/lib/x86_64-linux-gnu" "$dir/anchors/usr/sbin/haproxy" -v 2>&1 | head -1 || true
    LD_LIBRARY_PATH="$dir/anchors/usr/lib/x86_64-linux-gnu" "$dir/anchors/usr/sbin/nginx" -v 2>&1 || true
    echo "== softirqs before"; cat /proc/softirqs
  } > "$out/machine.txt" 2>&1

  runtime_checks > "$out/runtime.txt" 2>&1 || true

  local args=(--json "$out/scaling.json" --window "${SCALING_WINDOW:-2}" --repeats "${SCALING_REPEATS:-1}" --keep)
  if [ -n "${SCALING_CPUS:-}" ]; then args+=(--scaling-cpus "$SCALING_CPUS"); fi
  local rc=0
  # SIGTERM ends the run cleanly: bench reports what it measured so far.
  timeout -s TERM -k 20 "${SCALING_LIMIT:-400}" "$dir/bin/bench" "${args[@]}" scaling \
    > "$out/scaling.md" 2> "$out/bench.log" || rc=$?
  { echo "== softirqs after"; cat /proc/softirqs; echo "== bench exit status: $rc"; } >> "$out/machine.txt"
  local kept
  kept=$(grep -o 'configs and logs kept in .*' "$out/bench.log" | tail -1 | sed 's/configs and logs kept in //')
  if [ -n "$kept" ] && [ -d "$kept" ]; then
    tar -czf "$out/logs.tar.gz" -C "$(dirname "$kept")" "$(basename "$kept")" 2>/dev/null || true
  fi
  tail -60 "$out/scaling.md"
  echo "scaling-device: exit $rc; files in $out: $(ls "$out" | tr '\n' ' ')"
  rm -rf "$dir"
  return "$rc"
}

# sni-router's worker count under a cgroup v2 cpu.max quota and under an affinity mask: the
# "async runtime" line of its log names the workers and the runtime's flavour.
runtime_checks() {
  local cfg log cg
  cfg=$(mktemp --suffix .yaml)
  printf 'listeners:\n  - name: gw\n    listen: 127.0.0.1:0\n' > "$cfg"
  log=$(mktemp)
  local last=$(( $(nproc) > 3 ? 2 : $(nproc) - 1 ))
  echo "== affinity: taskset -c 0-$last"
  timeout 2 taskset -c "0-$last" sni-router --config "$cfg" > "$log" 2>&1 || true
  grep -o 'async runtime.*' "$log" | head -1 || tail -3 "$log"
  echo "== no limit ($(nproc) CPUs)"
  timeout 2 sni-router --config "$cfg" > "$log" 2>&1 || true
  grep -o 'async runtime.*' "$log" | head -1 || tail -3 "$log"
  if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
    cg=/sys/fs/cgroup/seedgate-scaling-check
    echo "+cpu" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    if mkdir -p "$cg" 2>/dev/null && [ -f "$cg/cpu.max" ]; then
      for q in "150000 100000" "250000 100000" "400000 100000"; do
        echo "$q" > "$cg/cpu.max"
        echo "== cgroup v2 cpu.max $q"
        timeout 2 sh -c "echo \$\$ > $cg/cgroup.procs; exec sni-router --config $cfg" > "$log" 2>&1 || true
        grep -o 'async runtime.*' "$log" | head -1 || tail -3 "$log"
      done
      rmdir "$cg" 2>/dev/null || true
    else
      echo "== cgroup v2: cannot make a child cgroup with cpu.max here"
    fi
  else
    echo "== cgroup v2 cpu controller not available here"
  fi
  rm -f "$cfg" "$log"
}

case "${1:-}" in
  --prepare) shift; prepare "$@" ;;
  -h|--help) sed -n '2,22p' "$0" ;;
  *) run "$@" ;;
esac
