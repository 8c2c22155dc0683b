#!/usr/bin/env bash
# Certificates and Secrets for a TEST landscape (self-signed CAs made here; production takes its
# certificates from the landscape's own CAs and rotation). Needs openssl; kubectl (client only: the
# Secrets are written as files, nothing is sent to a cluster) for the Secrets: without it only the
# PKI (OUT_DIR/pki) is written. docs/guides/certificates.md ("Certificates: which goes where") says
# which file is used where.
#
#   deploy/pki/make-test-secrets.sh OUT_DIR [SHOOT ...]      (default shoot: shoot-a)
#   kubectl apply -f OUT_DIR/seed/            # on the seed (namespace seedgate, shoot namespaces)
#   kubectl apply -f OUT_DIR/shoot-a/         # on shoot-a (namespace kube-system)
#
# Three CAs, so that no certificate can act in another role:
#   server-ca   issues proxy-server's certificates: the agents' listener (proxy.seed.example.com)
#               and the egress front end (proxy-server.seedgate.svc.cluster.local); agents and
#               kube-apiservers trust it.
#   agents-ca   issues the agents' client certificates, CN = cluster name; proxy-server trusts it on
#               agents.listen.
#   egress-ca   issues kube-apiservers' egress client certificates, CN = cluster name; proxy-server
#               trusts it on the egress front end.
set -euo pipefail
out=${1:?usage: $0 OUT_DIR [SHOOT ...]}
shift
shoots=("$@")
[ ${#shoots[@]} -gt 0 ] || shoots=(shoot-a)
TUNNEL_NAME=${TUNNEL_NAME:-proxy.seed.example.com}
EGRESS_NAME=${EGRESS_NAME:-proxy-server.seedgate.svc.cluster.local}
DAYS=${DAYS:-90}

mkdir -p "$out/pki"
cd "$out/pki"

ca() { # name
  [ -f "$1.crt" ] && return
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$DAYS" \
    -subj "/CN=seedgate test $1" -keyout "$1.key" -out "$1.crt" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
}
leaf() { # ca stem cn usage [dns]
  local ext="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=$4"
  [ -n "${5:-}" ] && ext="$ext
subjectAltName=DNS:$5"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$3" \
    -keyout "$2.key" -out "$2.csr" 2>/dev/null
  openssl x509 -req -in "$2.csr" -CA "$1.crt" -CAkey "$1.key" -CAcreateserial -days "$DAYS" \
    -extfile <(printf '%s\n' "$ext") -out "$2.crt" 2>/dev/null
  rm -f "$2.csr"
}
tls_secret() { # file namespace name stem ca
  kubectl create secret generic "$3" --namespace "$2" --dry-run=client -o yaml \
    --from-file=tls.crt="$4.crt" --from-file=tls.key="$4.key" --from-file=ca.crt="$5.crt" >"$1"
}

ca server-ca
ca agents-ca
ca egress-ca
leaf server-ca agents-listener "$TUNNEL_NAME" serverAuth "$TUNNEL_NAME"
leaf server-ca egress-frontend "$EGRESS_NAME" serverAuth "$EGRESS_NAME"
[ -f admin-token ] || openssl rand -hex 32 | tr -d '\n' >admin-token

for shoot in "${shoots[@]}"; do
  leaf agents-ca "agent-$shoot" "$shoot" clientAuth
  leaf egress-ca "egress-$shoot" "$shoot" clientAuth
done
if ! command -v kubectl >/dev/null; then
  echo "kubectl not found: wrote the PKI only ($out/pki), no Secrets"
  exit 0
fi

mkdir -p "$out/seed"
kubectl create namespace seedgate --dry-run=client -o yaml >"$out/seed/00-namespace.yaml"
tls_secret "$out/seed/proxy-server-agents-tls.yaml" seedgate proxy-server-agents-tls agents-listener agents-ca
tls_secret "$out/seed/proxy-server-frontend-tls.yaml" seedgate proxy-server-frontend-tls egress-frontend egress-ca
kubectl create secret generic seedgate-admin-token --namespace seedgate --dry-run=client -o yaml \
  --from-file=token=admin-token >"$out/seed/seedgate-admin-token.yaml"

for shoot in "${shoots[@]}"; do
  # The kube-apiserver's egress client certificate, in the shoot's control-plane namespace on the seed.
  tls_secret "$out/seed/egress-$shoot.yaml" "shoot--${shoot#shoot-}" seedgate-egress-tls "egress-$shoot" server-ca
  mkdir -p "$out/$shoot"
  tls_secret "$out/$shoot/proxy-agent-tls.yaml" kube-system proxy-agent-tls "agent-$shoot" server-ca
  kubectl create secret generic seedgate-admin-token --namespace kube-system --dry-run=client -o yaml \
    --from-file=token=admin-token >"$out/$shoot/seedgate-admin-token.yaml"
done
echo "written: $out/seed/ and $out/<shoot>/ (keys and CAs in $out/pki: keep them private)"
