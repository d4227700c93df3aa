"""The lab's certificates: one CA per cluster, the apiserver's serving certificate, client
certificates (admin, the apiserver's kubelet client), and the service-account signing key.

ECDSA P-256 keys: generated in microseconds, accepted by every component for TLS and for
service-account token signing.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
        cert_path.write_bytes(self.cert_pem)
        key_path.write_bytes(self.key_pem)
        key_path.chmod(0o600)
        return cert_path, key_path


def load(directory: Path, stem: str) -> KeyPair:
    """A key pair `write` wrote (the lab's CAs, to sign more certificates later)."""
    cert = x509.load_pem_x509_certificate((directory / f"{stem}.crt").read_bytes())
    key = serialization.load_pem_private_key((directory / f"{stem}.key").read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory / stem}.key is not an EC key")
    return KeyPair(key, cert)


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def make_ca(common_name: str) -> KeyPair:
    key = new_key()
    now = datetime.datetime.now(datetime.UTC)
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY * 10)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(key, cert)


def issue(
    ca: KeyPair,
    common_name: str,
    *,
    organizations: tuple[str, ...] = (),
    dns_names: tuple[str, ...] = (),
    ip_addresses: tuple[str, ...] = (),
    server: bool = False,
    client: bool = False,
) -> KeyPair:
    """A leaf certificate signed by `ca`, for serving, client authentication, or both."""
    key = new_key()
    now = datetime.datetime.now(datetime.UTC)
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organizations))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return KeyPair(key, builder.sign(ca.key, hashes.SHA256()))


def write_service_account_key(path: Path, public_path: Path) -> Path:
    """The token signing key (SEC1 "EC PRIVATE KEY", which every component parses) and its
    public half (for the apiserver's --service-account-key-file)."""
    key = new_key()
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)
    public_path.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return path
