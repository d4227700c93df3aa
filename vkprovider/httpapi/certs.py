"""The kubelet API's serving certificate: from files, else from a CertificateSigningRequest
with signer kubernetes.io/kubelet-serving (approved by us where RBAC allows), else self-signed
with a warning, so the API still serves (the apiserver verifies kubelet certificates only when
started with --kubelet-certificate-authority).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vkprovider import logs
from vkprovider.kube import ApiError, Forbidden, KubeClient
from vkprovider.settings import HttpSettings

SIGNER = "kubernetes.io/kubelet-serving"
#: Label on the kubelet-serving CSRs the provider submits, so it approves only its own.
SERVING_CERTIFICATE = "vkprovider.io/serving-certificate"
CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


@dataclass(frozen=True)
class ServingCertificate:
    cert_file: Path
    key_file: Path
    source: str  # "files", "csr" or "self-signed"


def _subject(node: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}"),
        ]
    )


def _sans(node: str, address: str) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = [x509.DNSName(node)]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(address)))
    except ValueError:
        names.append(x509.DNSName(address))
    return x509.SubjectAlternativeName(names)


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def csr_pem(key: ec.EllipticCurvePrivateKey, node: str, address: str) -> bytes:
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(_subject(node))
        .add_extension(_sans(node, address), critical=False)
        .sign(key, hashes.SHA256())
    )
    return request.public_bytes(serialization.Encoding.PEM)


def self_signed(key: ec.EllipticCurvePrivateKey, node: str, address: str) -> bytes:
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_subject(node))
        .issuer_name(_subject(node))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(_sans(node, address), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def csr_object(name: str, request: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name, "labels": {SERVING_CERTIFICATE: "true"}},
        "spec": {
            "request": base64.b64encode(request).decode(),
            "signerName": SIGNER,
            "usages": ["digital signature", "server auth"],
        },
    }


async def _via_csr(client: KubeClient, node: str, address: str, directory: Path, timeout: float) -> bytes | None:
    log = logs.get("certs", node=node)
    key_path = directory / "serving.key"
    key = ec.generate_private_key(ec.SECP256R1())
    _write_key(key, key_path)
    name = f"vkprovider-serving-{node}-{uuid.uuid4().hex[:8]}"
    await client.create(CSR_PATH, csr_object(name, csr_pem(key, node, address)))
    approval = await client.get(f"{CSR_PATH}/{name}")
    approval.setdefault("status", {})["conditions"] = [
        {
            "type": "Approved",
            "status": "True",
            "reason": "VKProviderApproved",
            "message": f"serving certificate of virtual node {node}, approved by vkprovider",
        }
    ]
    try:
        await client.replace(f"{CSR_PATH}/{name}/approval", approval)
    except Forbidden:
        log.warning("not allowed to approve our serving CSR; waiting for someone else to", csr=name)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        current = await client.get(f"{CSR_PATH}/{name}")
        certificate = current.get("status", {}).get("certificate")
        if certificate:
            return base64.b64decode(certificate)
        conditions = {c.get("type") for c in current.get("status", {}).get("conditions", [])}
        if conditions & {"Denied", "Failed"}:
            log.warning("serving CSR was refused", csr=name, conditions=sorted(conditions))
            return None
        await asyncio.sleep(0.5)
    log.warning("serving CSR not signed in time", csr=name, timeout=timeout)
    return None


async def serving_certificate(
    client: KubeClient, settings: HttpSettings, *, node: str, address: str, directory: Path
) -> ServingCertificate:
    log = logs.get("certs", node=node)
    if settings.cert_file and settings.key_file:
        return ServingCertificate(settings.cert_file, settings.key_file, "files")
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "serving.crt", directory / "serving.key"
    if settings.csr:
        try:
            pem = await _via_csr(client, node, address, directory, settings.csr_timeout)
        except ApiError as exc:
            log.warning("serving CSR failed", error=str(exc))
            pem = None
        if pem:
            cert_path.write_bytes(pem)
            log.info("serving certificate issued through a CSR", signer=SIGNER)
            return ServingCertificate(cert_path, key_path, "csr")
    key = ec.generate_private_key(ec.SECP256R1())
    _write_key(key, key_path)
    cert_path.write_bytes(self_signed(key, node, address))
    log.warning(
        "serving with a SELF-SIGNED certificate: clients that verify kubelet certificates will refuse it;"
        " give http.cert_file/key_file or allow the kubelet-serving CSR to be approved and signed"
    )
    return ServingCertificate(cert_path, key_path, "self-signed")
