"""The routing webhook: a mutating admission webhook served by the provider (federation.dispatch.routing).

It listens on its own HTTPS port with a certificate from a CA it makes at start-up, and
registers itself: a MutatingWebhookConfiguration whose caBundle is that CA and whose URL is the
configured one (a Service's address in a cluster, https://127.0.0.1:port in the lab). Every
webhook there fails open (failurePolicy Ignore, 2 s): with the provider down, pods are created
as usual, only not routed. The configuration is left in place on exit, so a restart only
refreshes its caBundle.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import json
import ssl
from typing import Any

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from federation.config import RoutingConfig
from federation.dispatch import routing
from vkprovider import logs
from vkprovider.kube import ApiError, KubeClient, create_or_replace
from vkprovider.kube.credentials import load_cert_chain

CONFIGS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def certificates(hosts: list[str], *, days: int = 3650) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, serving certificate, serving key), PEM, for `hosts` (names or IPs)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("vkprovider-routing-ca"))
        .issuer_name(_name("vkprovider-routing-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0] if hosts else "vkprovider-routing"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return ca.public_bytes(serialization.Encoding.PEM), leaf.public_bytes(serialization.Encoding.PEM), key_pem


def review(policy: str, body: dict[str, Any], instance: str) -> dict[str, Any]:
    """The AdmissionReview answer for a pod sent to /route/{policy} (pure; never refuses)."""
    request = body.get("request") or {}
    pod = request.get("object") or {}
    chosen = routing.policy_of(pod, None) if policy == "pod" else (policy if policy in routing.POLICIES else None)
    ops = routing.route(pod, chosen, instance) if chosen and request.get("kind", {}).get("kind", "Pod") == "Pod" else []
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    if ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


class RoutingWebhook:
    def __init__(self, config: RoutingConfig, *, name: str) -> None:
        self.config = config
        self.name = config.configuration_name or f"vkprovider-routing-{name}"
        self.instance = name  # the provider's node name: its virtual nodes carry it
        self.reviews = 0
        self._log = logs.get("routing")

    @property
    def url(self) -> str:
        return self.config.url or f"https://{self.config.hosts[0]}:{self.config.port}"

    async def _route(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return web.Response(status=400, text="an AdmissionReview (JSON) is expected\n")
        self.reviews += 1
        answer = review(request.match_info["policy"], body if isinstance(body, dict) else {}, self.instance)
        return web.json_response(answer)

    async def _register(self, client: KubeClient, ca_pem: bytes) -> None:
        body = routing.webhook_configuration(
            name=self.name, url=self.url, ca_bundle=base64.b64encode(ca_pem).decode(), timeout_seconds=2
        )
        await create_or_replace(client, CONFIGS, body)

    async def run(self, client: KubeClient) -> None:
        """Serve and register until cancelled."""
        ca_pem, cert_pem, key_pem = certificates(list(self.config.hosts))
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        load_cert_chain(context, cert_pem, key_pem)  # on disk only while it loads
        app = web.Application()
        app.router.add_post("/route/{policy}", self._route)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.config.bind, self.config.port, ssl_context=context).start()
            self._log.info("routing webhook serving", port=self.config.port, url=self.url)
            while True:
                try:
                    await self._register(client, ca_pem)
                    break
                except ApiError as exc:
                    self._log.warning("routing webhook not registered yet", error=str(exc))
                    await asyncio.sleep(5.0)
            self._log.info("routing webhook registered", configuration=self.name)
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()
