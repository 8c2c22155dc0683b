#!/usr/bin/env bash
# Which of the workspace's source files two requests run through, counted by a machine: the
# hand-kept inventory in docs/design/walks.md, checked.
#
#   bench/walks.sh [BIN_DIR]     # default target/release (any build with line tables: both
#                                # profiles of this workspace have them)
#
# Needs valgrind (callgrind_control included), openssl, curl and python3; ports 26443, 28090,
# 29132, 29902 and 29903 on loopback free. It starts proxy-server and proxy-agent under callgrind
# with a plain-HTTP front end, an agent with a client certificate over h2, and a stand-in target
# in the "shoot" (python's http.server), then records three windows in each process:
#
#   way in   from the agent's exec (proxy-server from the same moment) until both logged the
#            session up: the agent's start-up included;
#   connect  one CONNECT through the front end to the target and the GET inside it, after a first
#            CONNECT (a session's first stream also steps the agent's slot machine), until both
#            connections are closed;
#   idle     as long as the CONNECT took, at least 3 s, with nothing asked.
#
# A file counts in a window when an instruction compiled from it ran there (code inlined into
# another file's function counts for the file it was written in). Both ends' keepalive is set to
# an hour so that no PING falls in a window; what still runs on a timer (the config and certificate
# file polls, the window tuning's sampling) is what the idle window shows, and files that ran
# there are marked `*`. The rule differs from the hand count's (that one leaves out start-up,
# timers and background futures woken by the request), so compare its figures only with its own.
set -euo pipefail

bin=$(realpath "${1:-target/release}")
ws=$(cd "$(dirname "$0")/.." && pwd)
for t in valgrind callgrind_control openssl curl python3; do
  command -v "$t" >/dev/null || { echo "walks.sh: needs $t" >&2; exit 2; }
done
dir=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
cd "$dir"
"$ws/deploy/pki/make-test-secrets.sh" "$dir" shoot-a >/dev/null 2>&1

cat >server.yaml <<EOF
admin: { listen: 127.0.0.1:29902 }
agents:
  listen: 127.0.0.1:29132
  tls:
    cert: $dir/pki/agents-listener.crt
    key: $dir/pki/agents-listener.key
    client_ca: $dir/pki/agents-ca.crt
  keepalive: { interval: 1h, timeout: 2h, suspect_after: 1h }
frontends:
  - name: egress
    listen: 127.0.0.1:28090
    cluster: shoot-a
EOF
cat >agent.yaml <<EOF
admin: { listen: 127.0.0.1:29903 }
tunnel:
  servers: [127.0.0.1:29132]
  tls:
    cert: $dir/pki/agent-shoot-a.crt
    key: $dir/pki/agent-shoot-a.key
    ca: $dir/pki/server-ca.crt
    server_name: proxy.seed.example.com
  allow: [127.0.0.0/8]
  keepalive: { interval: 1h, timeout: 2h, suspect_after: 1h }
EOF

# Bounded waits: a log line (tenths of a second), the relayed connections gone.
wait_log() { # file pattern seconds
  local i
  for ((i = 0; i < $3 * 10; i++)); do grep -q "$2" "$1" && return 0; sleep 0.1; done
  echo "walks.sh: no '$2' in $1 within $3 s" >&2; tail -5 "$1" >&2; exit 1
}
wait_closed() {
  local i
  for ((i = 0; i < 600; i++)); do
    ss -Htn state established '( sport = :28090 or dport = :26443 )' | grep -q . || return 0
    sleep 0.1
  done
  echo "walks.sh: the CONNECT's connections are still open after 60 s" >&2; exit 1
}
connect() { curl -sS -o /dev/null -p -x http://127.0.0.1:28090 http://127.0.0.1:26443/ --max-time 120; wait_closed; }
both() { local p; for p in "$server" "$agent"; do callgrind_control "$@" "$p" >/dev/null 2>&1; done; }

vg=(valgrind --tool=callgrind --dump-instr=no --compress-strings=no --compress-pos=no)
python3 -m http.server 26443 --bind 127.0.0.1 >target.log 2>&1 & pids+=($!)
"${vg[@]}" --instr-atstart=no --callgrind-out-file="$dir/server.%p.out" \
  "$bin/proxy-server" --config server.yaml >server.log 2>&1 & server=$!; pids+=($server)
wait_log server.log "agents listener up" 120
callgrind_control -i on "$server" >/dev/null 2>&1
"${vg[@]}" --callgrind-out-file="$dir/agent.%p.out" \
  "$bin/proxy-agent" --config agent.yaml >agent.log 2>&1 & agent=$!; pids+=($agent)
wait_log server.log "agent session up" 180
wait_log agent.log "tunnel session up" 60
both -i off; both -d way-in
connect
both -i on; t0=$(date +%s%N); connect; t1=$(date +%s%N); both -i off; both -d connect
both -i on; sleep "$(( (t1 - t0) / 1000000000 > 3 ? (t1 - t0) / 1000000000 : 3 ))"; both -i off; both -d idle

python3 - "$dir" <<'EOF'
import collections, glob, re, sys
d = sys.argv[1]
crate = re.compile(r"(?:^|/)((?:config|wire|proxy-core|proxy-agent|proxy-server|sni-router)/src/.+\.rs)$")

def ran(n):
    """Workspace files with an instruction of their own run in dump n of both processes."""
    seen = set()
    for path in glob.glob(f"{d}/*.out.{n}"):
        fl = fi = None
        call = False
        for line in open(path, errors="replace"):
            if line.startswith("fl="):
                fl, fi = line[3:].strip(), None
            elif line.startswith(("fi=", "fe=")):
                fi = line[3:].strip()
            elif line.startswith("fn="):
                fi = None
            elif line.startswith("calls="):
                call = True  # the next cost line is the callee's, not this file's
            elif line[:1].isdigit() or line[:1] in "+-*":
                if call:
                    call = False
                    continue
                m = crate.search(fi or fl or "")
                if m and int(line.split()[1]) > 0:
                    seen.add(m.group(1))
    return seen

way_in, conn, idle = ran(1), ran(2), ran(3)
for name, files in (("an agent's way in", way_in), ("a CONNECT", conn)):
    by = collections.defaultdict(list)
    for f in sorted(files):
        by[f.split("/")[0]].append(f)
    timers = len(files & idle)
    print(f"{name}: {len(files)} files ({timers} of them also ran in the idle window, marked *)")
    for c in ("config", "wire", "proxy-core", "proxy-agent", "proxy-server"):
        shown = " ".join(f.split("/src/", 1)[1] + ("*" if f in idle else "") for f in by[c])
        print(f"  {c:13} {len(by[c]):3}  {shown}")
EOF
