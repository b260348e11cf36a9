"""Certificates for TLS and keys for SuperNode authentication (no openssl needed).

    python -m fairvfl_flwr.tools.tls --out secrets/ --parties 6 [--host superlink.example.org]

writes::

    certs/ca.crt, certs/ca.key        a private certificate authority (keep ca.key offline)
    certs/server.crt, certs/server.key  the SuperLink's certificate, signed by the CA, valid for
                                        127.0.0.1, localhost and every --host given
    keys/partyK, keys/partyK.pub      each party's SuperNode key pair (ECDSA P-384, OpenSSH
                                        format), as Flower's node authentication expects

The SuperLink gets ``--ssl-ca-certfile certs/ca.crt --ssl-certfile certs/server.crt
--ssl-keyfile certs/server.key --enable-supernode-auth``; each SuperNode gets
``--root-certificates certs/ca.crt --auth-supernode-private-key keys/partyK``; and each
``keys/partyK.pub`` is registered once with ``flwr supernode register``. Private keys are
written with mode 0600. Uses ``cryptography``, which Flower itself depends on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fairvfl_flwr.tools.localfed import Security


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if private:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def make_certificates(out: Path, hosts: list[str] | None = None, days: int = 365) -> tuple[Path, Path, Path]:
    """A CA and a SuperLink certificate for ``hosts`` (+ 127.0.0.1, localhost); return (ca, cert, key)."""
    out = Path(out)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "FairVFL federation CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = []
    for host in ["127.0.0.1", "localhost", *(hosts or [])]:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (hosts or ["127.0.0.1"])[0])]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    certs = out / "certs"
    _write(certs / "ca.crt", ca.public_bytes(serialization.Encoding.PEM))
    _write(certs / "ca.key", _pem_key(ca_key), private=True)
    _write(certs / "server.crt", cert.public_bytes(serialization.Encoding.PEM))
    _write(certs / "server.key", _pem_key(key), private=True)
    return certs / "ca.crt", certs / "server.crt", certs / "server.key"


def make_node_key(path: Path) -> tuple[Path, Path]:
    """One SuperNode's key pair: ``path`` (private, OpenSSH) and ``path.pub``."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    path = Path(path)
    _write(path, private, private=True)
    _write(path.with_name(path.name + ".pub"), public + f" {path.name}\n".encode())
    return path, path.with_name(path.name + ".pub")


def make_security(out: Path, parties: int, hosts: list[str] | None = None) -> Security:
    """Everything a TLS + authenticated federation needs, under ``out``."""
    ca, cert, key = make_certificates(out, hosts)
    nodes = [make_node_key(Path(out) / "keys" / f"party{k}") for k in range(parties)]
    return Security(ca_cert=ca, server_cert=cert, server_key=key, node_keys=nodes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fairvfl-tls", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--parties", type=int, default=6, help="number of SuperNode key pairs (default 6)")
    p.add_argument("--host", action="append", default=[], help="SuperLink host name or IP (repeatable)")
    p.add_argument("--days", type=int, default=365, help="certificate validity (default 365 days)")
    args = p.parse_args(argv)
    if args.parties < 0:
        print("tls: --parties must be >= 0", file=sys.stderr)
        return 2
    ca, cert, key = make_certificates(args.out, args.host, args.days)
    for k in range(args.parties):
        make_node_key(args.out / "keys" / f"party{k}")
    print(f"CA certificate      {ca}   (give to every SuperNode and to flwr: root-certificates)")
    print(f"SuperLink cert/key  {cert} {key}")
    print(f"SuperNode keys      {args.out / 'keys'}/partyK (private, stays on party K) and partyK.pub (register it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
