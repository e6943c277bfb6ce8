"""The LeaderWorkerSet controller's local wiring: its config, webhooks by URL on loopback, RBAC and ports."""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
from pathlib import Path
from urllib.parse import urlparse

from xpyd_api import labels as L
from xpyd_cluster import lws, pki
from xpyd_cluster.paths import Layout

LAYOUT = Layout(state=Path("/state"), cache=Path("/cache"))
CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_config_binds_everything_to_loopback_without_leader_election_or_cert_rotation() -> None:
    cfg = lws.config(LAYOUT)
    assert cfg["kind"] == "Configuration" and cfg["apiVersion"] == "config.lws.x-k8s.io/v1alpha1"
    assert cfg["leaderElection"] == {"leaderElect": False}
    assert cfg["internalCertManagement"] == {"enable": False}
    assert cfg["webhook"] == {"port": 10270, "host": "127.0.0.1", "certDir": "/state/lws/certs"}
    assert cfg["metrics"]["bindAddress"] == "127.0.0.1:10271"
    assert cfg["health"]["healthProbeBindAddress"] == "127.0.0.1:10272"


def test_lws_ports_clash_with_no_other_port_of_the_layout() -> None:
    ports = [v for f in dataclasses.fields(Layout) if isinstance(v := getattr(LAYOUT, f.name), int)]
    taken = {LAYOUT.etcd_port + 1, 10247, 10257, 10259}  # etcd peer, kwok, controller manager, scheduler
    assert len(set(ports)) == len(ports)
    assert not taken & {LAYOUT.lws_webhook_port, LAYOUT.lws_metrics_port, LAYOUT.lws_health_port}


def test_webhooks_call_the_controller_by_url_on_loopback_with_the_cluster_ca() -> None:
    mutating, validating = lws.webhook_configurations(LAYOUT, CA)
    assert mutating["kind"] == "MutatingWebhookConfiguration"
    assert validating["kind"] == "ValidatingWebhookConfiguration"
    hooks = [*mutating["webhooks"], *validating["webhooks"]]
    assert {h["clientConfig"]["url"].split(":10270")[1] for h in hooks} == {
        "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
        "/mutate--v1-pod",
        "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
        "/validate--v1-pod",
    }
    for hook in hooks:
        url = urlparse(hook["clientConfig"]["url"])
        assert url.scheme == "https" and ipaddress.ip_address(url.hostname or "").is_loopback
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == CA
        assert "service" not in hook["clientConfig"]
        assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"


def test_pod_webhooks_only_see_pods_of_a_leaderworkerset() -> None:
    hooks = [h for c in lws.webhook_configurations(LAYOUT, CA) for h in c["webhooks"]]
    pods = [h for h in hooks if h["rules"][0]["resources"] == ["pods"]]
    sets = [h for h in hooks if h["rules"][0]["resources"] == [L.LWS_PLURAL]]
    assert len(pods) == len(sets) == 2
    assert all(h["objectSelector"]["matchExpressions"] == [{"key": L.LWS_NAME, "operator": "Exists"}] for h in pods)
    assert all("objectSelector" not in h and h["rules"][0]["apiGroups"] == [L.LWS_GROUP] for h in sets)


def test_controller_identity_is_bound_and_the_probe_is_a_minimal_lws() -> None:
    assert any(c.name == "lws" and c.user == pki.LWS_USER and not c.groups for c in pki.CLIENTS)
    (binding,) = lws.RBAC
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": pki.LWS_USER}]
    probe = lws.probe_lws()
    assert probe["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and probe["kind"] == "LeaderWorkerSet"
    assert probe["spec"]["leaderWorkerTemplate"]["size"] == 1


def test_argv_names_config_and_own_kubeconfig() -> None:
    argv = lws.argv(LAYOUT)
    assert argv[0] == "/cache/bin/lws"
    assert "--config=/state/lws/config.yaml" in argv
    assert "--kubeconfig=/state/pki/lws.kubeconfig" in argv
    assert "--leader-elect=false" in argv
    assert LAYOUT.lws_crd == Path("/cache/bin/leaderworkerset.x-k8s.io_leaderworkersets.yaml")


def test_webhook_serving_certificate_is_for_127_0_0_1_and_signed_by_the_cluster_ca(tmp_path: Path) -> None:
    from cryptography import x509

    layout = Layout(state=tmp_path, cache=tmp_path)
    pki.ensure(layout)
    pki.ensure_serving(layout, layout.lws / "certs", "xpyd-lws-webhook")
    cert = x509.load_pem_x509_certificate((layout.lws / "certs" / "tls.crt").read_bytes())
    ca = x509.load_pem_x509_certificate((layout.pki / "ca.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert (layout.lws / "certs" / "tls.key").stat().st_mode & 0o077 == 0
    assert (layout.pki / "lws.kubeconfig").exists()
