"""A tenant member's token (issue 33, item 4), its pure parts: when it is renewed, and the
TokenRequest that renews it with the same account and binding. The renewal against a real
member, a capped lifetime and a revoked binding are tested end to end (test_onboard)."""

from __future__ import annotations

from federation.members.tokens import renewal_due, token_request

CLAIMS = {
    "iat": 1000,
    "exp": 1600,
    "kubernetes.io": {
        "namespace": "vkprovider-tenant-t1",
        "serviceaccount": {"name": "provider", "uid": "sa-uid"},
        "secret": {"name": "provider-token", "uid": "secret-uid"},
    },
}


def test_a_token_is_renewed_once_its_share_of_life_has_passed() -> None:
    assert renewal_due(CLAIMS, 0.5) == 1300.0
    assert renewal_due(CLAIMS, 0.1) == 1060.0
    # A token that does not say when it expires (a static one) is not renewed.
    assert renewal_due({"iat": 1000}, 0.5) is None
    assert renewal_due({"iat": 1000, "exp": 900}, 0.5) is None


def test_the_renewal_keeps_the_account_and_the_binding() -> None:
    request = token_request(CLAIMS, 600)
    assert request is not None
    path, body = request
    assert path == "/api/v1/namespaces/vkprovider-tenant-t1/serviceaccounts/provider/token"
    assert body["spec"] == {
        "expirationSeconds": 600,
        "boundObjectRef": {"kind": "Secret", "apiVersion": "v1", "name": "provider-token", "uid": "secret-uid"},
    }
    unbound = {**CLAIMS, "kubernetes.io": {"namespace": "x", "serviceaccount": {"name": "provider"}}}
    assert token_request(unbound, 600) is None
