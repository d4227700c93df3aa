"""What a pod refers to and the kubelet's answer when it is missing (vkprovider.references):
every place a ConfigMap or Secret can be named, optional or not, keys, and the status and
Events a held pod shows."""

from __future__ import annotations

from typing import Any

from vkprovider.references import Missing, Use, kubelet_event, uses, verdict, waiting_status


def _spec() -> dict[str, Any]:
    return {
        "volumes": [
            {"name": "cfg", "configMap": {"name": "settings", "items": [{"key": "lr", "path": "lr"}]}},
            {"name": "tok", "secret": {"secretName": "token", "optional": True}},
            {
                "name": "proj",
                "projected": {
                    "sources": [
                        {"configMap": {"name": "kube-root-ca.crt"}},  # every namespace has it
                        {"secret": {"name": "tls"}},
                        {"serviceAccountToken": {"path": "token"}},
                    ]
                },
            },
            {"name": "scratch", "emptyDir": {}},
        ],
        "initContainers": [{"name": "init", "envFrom": [{"secretRef": {"name": "init-env"}}]}],
        "containers": [
            {
                "name": "main",
                "env": [
                    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "a"}}},
                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "token", "key": "b", "optional": True}}},
                    {"name": "C", "value": "plain"},
                    {"name": "D", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                ],
                "envFrom": [{"configMapRef": {"name": "extras", "optional": True}}],
            }
        ],
        "imagePullSecrets": [{"name": "pull"}],  # a kubelet starts the pod without it
    }


def test_every_reference_is_found_with_where_it_is_and_whether_it_is_optional() -> None:
    assert uses(_spec()) == [
        Use("configmap", "settings", False, volume="cfg", keys=("lr",)),
        Use("secret", "token", True, volume="tok"),
        Use("secret", "tls", False, volume="proj"),
        Use("secret", "init-env", False, container="init"),
        Use("configmap", "settings", False, container="main", keys=("a",)),
        Use("secret", "token", True, container="main", keys=("b",)),
        Use("configmap", "extras", True, container="main"),
    ]
    assert uses({"containers": [{"name": "main", "image": "x"}]}) == []


def test_the_verdict_names_missing_objects_and_keys_in_the_kubelets_words() -> None:
    refs = uses(_spec())
    objects: dict[Any, Any] = {
        ("configmap", "settings"): {"data": {"lr": "0.1"}},  # no key "a"
        ("secret", "token"): None,
        ("secret", "tls"): {"data": {"tls.crt": "", "tls.key": ""}},
        ("secret", "init-env"): {"data": {}, "binaryData": {}},
        ("configmap", "extras"): None,
    }
    missing = verdict(refs, objects, namespace="ns")
    assert [(m.use.name, m.use.volume or m.use.container, m.key, m.reason, m.message) for m in missing] == [
        ("token", "tok", None, "OptionalSecretNotFound", 'secret "token" not found'),
        ("settings", "main", "a", "MandatoryConfigMapKeyNotFound", "couldn't find key a in ConfigMap ns/settings"),
        ("token", "main", None, "OptionalSecretNotFound", 'secret "token" not found'),
        ("extras", "main", None, "OptionalConfigMapNotFound", 'configmap "extras" not found'),
    ]
    key_in_volume = Missing(Use("secret", "tls", False, volume="proj", keys=("ca",)), "ca", "ns")
    assert key_in_volume.message == "secret references non-existent secret key: ca"
    # Forbidden to read: not held for what cannot be checked.
    assert verdict([Use("secret", "x", False, volume="v")], {("secret", "x"): {"unchecked": True}}, namespace="n") == []


def test_a_missing_volume_keeps_every_container_creating_and_env_fails_only_its_container() -> None:
    pod: Any = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": [{"name": "a", "image": "i:1"}, {"name": "b", "image": "i:2"}]},
    }
    volume = Missing(Use("configmap", "cfg", False, volume="v"), None, "ns")
    env = Missing(Use("secret", "s", False, container="b"), None, "ns")
    status = waiting_status(pod, [volume, env])
    assert status["phase"] == "Pending" and "startTime" not in status
    assert [c["state"] for c in status["containerStatuses"]] == [{"waiting": {"reason": "ContainerCreating"}}] * 2
    status = waiting_status(pod, [env])
    assert [c["state"] for c in status["containerStatuses"]] == [
        {"waiting": {"reason": "ContainerCreating"}},
        {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "s" not found'}},
    ]
    assert kubelet_event(volume) == (
        "FailedMount",
        'MountVolume.SetUp failed for volume "v" : configmap "cfg" not found',
    )
    assert kubelet_event(env) == ("Failed", 'Error: secret "s" not found')
    assert volume.reason == "MandatoryConfigMapNotFound" and env.reason == "MandatorySecretNotFound"
