#!/usr/bin/env bash
# A test CA and per-role certificates for local clusters and tests (docs/security.md), made with
# openssl. Each role's certificate names it in a URI SAN (spiffe://tandem/<role>) and is valid
# for localhost and 127.0.0.1, so public clients can verify the router by host name too.
#
#   scripts/dev-certs.sh DIR
#       DIR/ca.pem, DIR/ca.key (kept if present) and DIR/<role>.pem, DIR/<role>.key for
#       router, prefill, decode and cache_store.
#   scripts/dev-certs.sh DIR --cert NAME [--uri URI] [--dns NAME,...] [--expired]
#       one more certificate, DIR/NAME.pem and DIR/NAME.key, from DIR's CA: with URI as its
#       URI SAN (none without --uri), extra DNS names, or valid only in 2020 (--expired).
set -euo pipefail

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 1 ]] || usage
dir=$1; shift
name="" uri="" dns="" expired=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --cert) name=$2; shift 2 ;;
    --uri) uri=$2; shift 2 ;;
    --dns) dns=$2; shift 2 ;;
    --expired) expired=1; shift ;;
    *) usage ;;
  esac
done
mkdir -p "$dir"
umask 077  # private keys readable by their owner only

if [[ ! -f $dir/ca.pem || ! -f $dir/ca.key ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=Tandem test CA $(basename "$dir")" -keyout "$dir/ca.key" -out "$dir/ca.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
fi

# issue NAME URI DNS EXPIRED: DIR/NAME.{key,pem} signed by the CA. `openssl ca` rather than
# `openssl x509 -req`, because only it takes explicit validity dates (for --expired).
issue() {
  local cert=$1 san_uri=$2 extra_dns=$3 old=$4
  local work; work=$(mktemp -d); trap 'rm -rf "$work"' RETURN
  local san="DNS:localhost,IP:127.0.0.1"
  [[ -n $san_uri ]] && san="URI:$san_uri,$san"
  local d; for d in ${extra_dns//,/ }; do san="$san,DNS:$d"; done
  : > "$work/index.txt"
  cat > "$work/ca.cnf" <<EOF
[ca]
default_ca = test
[test]
database = $work/index.txt
new_certs_dir = $work
certificate = $dir/ca.pem
private_key = $dir/ca.key
default_md = sha256
policy = any
copy_extensions = none
rand_serial = yes
unique_subject = no
[any]
commonName = supplied
[leaf]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = $san
EOF
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$cert" \
    -keyout "$dir/$cert.key" -out "$work/req.csr" 2>/dev/null
  local dates=(-days 825)
  [[ $old == 1 ]] && dates=(-startdate 20200101000000Z -enddate 20200102000000Z)
  openssl ca -batch -config "$work/ca.cnf" -extensions leaf "${dates[@]}" -notext \
    -in "$work/req.csr" -out "$dir/$cert.pem" 2>/dev/null
}

if [[ -n $name ]]; then
  issue "$name" "$uri" "$dns" "$expired"
else
  for role in router prefill decode cache_store; do
    issue "$role" "spiffe://tandem/$role" "$dns" 0
  done
fi
