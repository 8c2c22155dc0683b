#!/usr/bin/env bash
# The HPACK reference attack against release binaries: a proxy-server with a gRPC front end on a
# Unix socket, one proxy-agent of its cluster, then hpack_references.py (see it for what is
# measured). Usage, from the repository root:
#   cargo build --release -p proxy-server -p proxy-agent
#   wire/tests/measure/hpack_references.sh target/release [hpack_references.py options]
set -euo pipefail
BIN=$(realpath "$1")
shift
HERE=$(dirname "$(realpath "$0")")
ROOT=$(realpath "$HERE/../../..")
DIR=$(mktemp -d /tmp/hpack-references.XXXXXX)
PIDS=()
stop() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  # Bounded: 10 s for each to drain and exit, then killed (the next run binds the same ports).
  for p in "${PIDS[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  if [ -n "${KEEP:-}" ]; then cp "$DIR/server.log" /tmp/hpack-server.log; fi
  rm -rf "$DIR"
}
trap stop EXIT
cd "$DIR"

# A CA, the agents listener's certificate, an agent's client certificate (CN = its cluster).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=test-ca \
  -keyout ca.key -out ca.crt -addext basicConstraints=critical,CA:TRUE -addext keyUsage=keyCertSign 2>/dev/null
issue() { # name subject extensions
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "$2" -keyout "$1.key" -out "$1.csr" 2>/dev/null
  printf '%s\n' "$3" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
}
issue server /CN=proxy.seed.test "subjectAltName=DNS:proxy.seed.test
extendedKeyUsage=serverAuth"
issue agent /CN=shoot-a "extendedKeyUsage=clientAuth"

ADMIN=127.0.0.1:19911 AGENTS=127.0.0.1:19912 AGENT_ADMIN=127.0.0.1:19913 ECHO=127.0.0.1:19914
cat >server.yaml <<EOF
admin: { listen: $ADMIN }
agents:
  listen: $AGENTS
  tls: { cert: $DIR/server.crt, key: $DIR/server.key, client_ca: $DIR/ca.crt }
frontends:
  - name: uds
    cluster: shoot-a
    protocol: grpc
    unix: $DIR/kas.sock
EOF
cat >agent.yaml <<EOF
admin: { listen: $AGENT_ADMIN }
tunnel:
  servers: ["$AGENTS"]
  tls: { cert: $DIR/agent.crt, key: $DIR/agent.key, ca: $DIR/ca.crt, server_name: proxy.seed.test }
  allow: ["127.0.0.1/32"]
EOF
RUST_LOG=${RUST_LOG:-info} "$BIN/proxy-server" --config server.yaml >server.log 2>&1 &
PIDS+=($!)
SERVER=$!
"$BIN/proxy-agent" --config agent.yaml >agent.log 2>&1 &
PIDS+=($!)
# Bounded: 30 s for the agent's session to be up.
up() {
  local m
  m=$(curl -sf "http://$ADMIN/metrics") || return 1
  grep -qE '^seedgate_agents_connected\{[^}]*cluster="shoot-a"[^}]*\} 1$' <<<"$m"
}
for _ in $(seq 300); do
  if up; then break; fi
  sleep 0.1
done
up || { curl -sf "http://$ADMIN/metrics" | grep agents_connected; cat server.log agent.log; exit 1; }
/opt/seedgate-ci-venv/bin/python3 "$HERE/hpack_references.py" --socket "$DIR/kas.sock" --pid "$SERVER" \
  --admin "$ADMIN" --echo "$ECHO" --proto "$ROOT/proxy-server/proto/konnectivity-client.proto" "$@"
