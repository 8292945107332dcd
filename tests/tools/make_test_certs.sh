#!/bin/sh
# Test-only certificates for gradd's mutual TLS tests, made fresh with
# openssl in DIR at test time (so no private key is ever committed):
#   ca.crt/.key            the cluster CA
#   node.crt/.key          a daemon: SAN localhost, 127.0.0.1 and "gradd",
#                          usable as TLS server and client
#   node2.crt/.key         a second daemon of the same CA (reload tests)
#   server-only.crt/.key   signed by the CA but not usable as a TLS client
#   other-ca.crt/.key      a stranger's CA
#   stranger.crt/.key      a daemon of the stranger's CA
# Every certificate is valid for 2 days. Usage: make_test_certs.sh DIR
set -eu
dir=${1:?usage: make_test_certs.sh DIR}
mkdir -p "$dir"
cd "$dir"
umask 077
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 \
          -out "$1.key" 2>/dev/null; }
ca() {
  key "$1"
  openssl req -x509 -new -key "$1.key" -days 2 -subj "/CN=$2" \
    -out "$1.crt" 2>/dev/null
}
sign() {  # name CA SAN EKU
  key "$1"
  openssl req -new -key "$1.key" -subj "/CN=$1" -out "$1.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\n' "$3" "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" \
    -CAcreateserial -days 2 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
ca ca "gradd test CA"
ca other-ca "stranger CA"
sign node ca "DNS:localhost,IP:127.0.0.1,DNS:gradd" serverAuth,clientAuth
sign node2 ca "DNS:localhost,IP:127.0.0.1,DNS:gradd" serverAuth,clientAuth
sign server-only ca "DNS:localhost,IP:127.0.0.1" serverAuth
sign stranger other-ca "DNS:localhost,IP:127.0.0.1" serverAuth,clientAuth
chmod 644 ./*.crt
