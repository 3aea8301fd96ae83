"""Certificates, keys, identities and kubeconfigs of the local cluster.

Owns everything the control plane needs to authenticate: a throw-away CA, the apiserver serving
certificate (SANs 127.0.0.1, localhost), the service-account signing key pair, the static-token
identities written to ``tokens.csv`` (read once by kube-apiserver at start), client certificates
for identities added after start (the same CA is the apiserver's ``--client-ca-file``), and one
kubeconfig per identity. Nothing here starts processes.
"""

from __future__ import annotations

import base64
import csv
import datetime
import ipaddress
import secrets
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Identity:
    """One user of the cluster: a static token (``token``) or a client certificate."""

    name: str  # short handle, e.g. "admin", "compute-domain-controller", "node-3"
    user: str  # the Kubernetes username, e.g. "system:node:node-3"
    groups: tuple[str, ...]
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    token: str | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)


def _ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    return path


class PKI:
    """The CA plus the files derived from it, all under ``directory``."""

    def __init__(self, directory: Path, *, extra_ips: tuple[str, ...] = ()) -> None:
        self.directory = directory
        self._ca_key = _ec_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "compute-domain-e2e-ca")])
        self._ca_name = name
        self._ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now())
            .not_valid_after(_now() + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca_pem = self._ca_cert.public_bytes(serialization.Encoding.PEM)
        self.ca_file = _write(directory / "ca.crt", self.ca_pem, 0o644)
        self.ca_key_file = _write(directory / "ca.key", _key_pem(self._ca_key))

        serving_cert, serving_key = self.issue(
            "kube-apiserver",
            (),
            server=True,
            dns_names=("localhost", "kubernetes", "kubernetes.default.svc"),
            ips=("127.0.0.1", *extra_ips),
        )
        self.serving_cert_file = _write(directory / "apiserver.crt", serving_cert, 0o644)
        self.serving_key_file = _write(directory / "apiserver.key", serving_key)

        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.sa_key_file = _write(directory / "sa.key", _key_pem(sa_key))
        self.sa_pub_file = _write(
            directory / "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
            0o644,
        )

    def issue(
        self,
        common_name: str,
        organizations: tuple[str, ...],
        *,
        server: bool = False,
        dns_names: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
    ) -> tuple[bytes, bytes]:
        """Issue a leaf certificate; returns ``(cert_pem, key_pem)``.

        For client certificates the apiserver maps CN to the username and O to the groups.
        """
        key = _ec_key()
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self._ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now())
            .not_valid_after(_now() + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)

    def cert_identity(self, name: str, user: str, groups: tuple[str, ...]) -> Identity:
        """An identity authenticated by a fresh client certificate (works after start)."""
        cert, key = self.issue(user, groups)
        return Identity(name=name, user=user, groups=groups, cert_pem=cert, key_pem=key)


def token_identity(name: str, user: str, groups: tuple[str, ...]) -> Identity:
    """An identity authenticated by a static bearer token (must exist before apiserver start)."""
    return Identity(name=name, user=user, groups=groups, token=secrets.token_hex(24))


def write_tokens_csv(path: Path, identities: list[Identity]) -> Path:
    """Write kube-apiserver's ``--token-auth-file``: ``token,user,uid,"group1,group2"``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_MINIMAL)
        for ident in identities:
            if ident.token is not None:
                w.writerow([ident.token, ident.user, ident.uid, ",".join(ident.groups)])
    path.chmod(0o600)
    return path


def write_kubeconfig(path: Path, server: str, ca_pem: bytes, ident: Identity) -> Path:
    """Write a self-contained kubeconfig (CA and credentials embedded) for ``ident``."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    user: dict[str, str] = {}
    if ident.token is not None:
        user["token"] = ident.token
    else:
        assert ident.cert_pem is not None
        assert ident.key_pem is not None
        user["client-certificate-data"] = b64(ident.cert_pem)
        user["client-key-data"] = b64(ident.key_pem)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)},
            }
        ],
        "users": [{"name": ident.name, "user": user}],
        "contexts": [{"name": ident.name, "context": {"cluster": "local", "user": ident.name}}],
        "current-context": ident.name,
    }
    return _write(path, yaml.safe_dump(config, sort_keys=False).encode())
