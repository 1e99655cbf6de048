#!/usr/bin/env bash
# Writes a throwaway CA and certificates into the current directory, with the openssl
# command-line tool, for the TLS tests and the walkthrough in docs/security.md:
#   ca.crt/ca.key              the CA (10 years)
#   server.crt/key             for 127.0.0.1 and localhost, valid 2020-2099
#   expired.crt/key            for 127.0.0.1 and localhost, valid only on 2020-01-01
#   wronghost.crt/key          for other.example only
#   client.crt/key             a client certificate (mutual TLS)
# Every leaf is signed by the CA, with serverAuth and clientAuth usage.
set -eu
d=$(pwd)
cat > ca.cnf <<CNF
[ ca ]
default_ca = kca
[ kca ]
database = $d/index.txt
serial = $d/serial
new_certs_dir = $d/newcerts
default_md = sha256
policy = any
copy_extensions = copy
unique_subject = no
x509_extensions = leaf
[ any ]
commonName = supplied
[ leaf ]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth,clientAuth
[ req ]
distinguished_name = dn
prompt = no
x509_extensions = v3ca
[ v3ca ]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[ dn ]
CN = kstate test CA
CNF
mkdir -p newcerts; : > index.txt; echo 1000 > serial
openssl req -config ca.cnf -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.crt -days 3650 2>/dev/null
leaf() {  # name subjectAltName notBefore notAfter
  openssl req -config ca.cnf -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1.key" -out "$1.csr" \
    -subj "/CN=$1" -addext "subjectAltName=$2" 2>/dev/null
  openssl ca -batch -config ca.cnf -cert ca.crt -keyfile ca.key -in "$1.csr" -out "$1.crt" -startdate "$3" -enddate "$4" -notext 2>/dev/null
}
leaf server "IP:127.0.0.1,DNS:localhost" 20200101000000Z 20991231235959Z
leaf expired "IP:127.0.0.1,DNS:localhost" 20200101000000Z 20200102000000Z
leaf wronghost "DNS:other.example" 20200101000000Z 20991231235959Z
leaf client "DNS:kstate-client" 20200101000000Z 20991231235959Z
chmod 600 ./*.key
