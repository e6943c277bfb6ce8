"""Certificates and kubeconfigs for the local control plane: TLS everywhere, one identity per component."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .paths import Layout

VALIDITY = datetime.timedelta(days=365)
API_SANS_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class Identity:
    """A client certificate's subject: CN is the user, O the groups."""

    name: str
    user: str
    groups: tuple[str, ...] = ()


# The admin and the cluster's own agents (kwok, the process kubelet) are cluster admins;
# the controller manager and scheduler get their built-in RBAC identities; the LeaderWorkerSet
# controller's user is bound by a ClusterRoleBinding (lws.RBAC).
LWS_USER = "xpyd:lws-controller"
CLIENTS = (
    Identity("admin", "kubernetes-admin", ("system:masters",)),
    Identity("kube-controller-manager", "system:kube-controller-manager"),
    Identity("kube-scheduler", "system:kube-scheduler"),
    Identity("kwok", "xpyd:kwok", ("system:masters",)),
    Identity("kubelet", "xpyd:process-kubelet", ("system:masters",)),
    Identity("prometheus", "xpyd:prometheus"),
    Identity("lws", LWS_USER),
)
LOOPBACK_SANS = ("localhost",)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _name(cn: str, groups: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


def _issue(layout: Layout, crt: Path, subject: x509.Name, server_dns: tuple[str, ...] | None) -> None:
    """A certificate signed by the cluster CA at crt (key next to it, .key); a server one when server_dns is set."""
    ca_key = serialization.load_pem_private_key((layout.pki / "ca.key").read_bytes(), None)
    ca = x509.load_pem_x509_certificate((layout.pki / "ca.crt").read_bytes())
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _key()
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server_dns is not None else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = _builder(subject, ca.subject, key).add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server_dns is not None:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in server_dns]
        sans += [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(crt.with_suffix(".key"), key)


def ensure_serving(layout: Layout, directory: Path, cn: str) -> None:
    """tls.crt and tls.key for a loopback server (127.0.0.1, localhost), as controller-runtime reads them."""
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / "tls.crt").exists():
        _issue(layout, directory / "tls.crt", _name(cn), server_dns=LOOPBACK_SANS)


def kubeconfig(layout: Layout, client: str) -> dict[str, object]:
    """A kubeconfig for one client certificate against the local API server."""
    pki = layout.pki
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "xpyd-local",
        "clusters": [
            {
                "name": "xpyd-local",
                "cluster": {"server": layout.server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": client,
                "user": {
                    "client-certificate": str(pki / f"{client}.crt"),
                    "client-key": str(pki / f"{client}.key"),
                },
            }
        ],
        "contexts": [{"name": "xpyd-local", "context": {"cluster": "xpyd-local", "user": client}}],
    }


def ensure(layout: Layout) -> None:
    """Create the CA, serving and client certificates, SA signing key and kubeconfigs once."""
    pki = layout.pki
    pki.mkdir(parents=True, exist_ok=True)
    if not (pki / "ca.crt").exists():
        key = _key()
        name = _name("xpyd-local-ca")
        cert = (
            _builder(name, name, key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        _write_key(pki / "ca.key", key)
        (pki / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if not (pki / "apiserver.crt").exists():
        _issue(layout, pki / "apiserver.crt", _name("kube-apiserver"), server_dns=API_SANS_DNS)
    if not (pki / "sa.key").exists():
        sa = _key()
        _write_key(pki / "sa.key", sa)
        (pki / "sa.pub").write_bytes(
            sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
    for ident in CLIENTS:
        if not (pki / f"{ident.name}.crt").exists():
            _issue(layout, pki / f"{ident.name}.crt", _name(ident.user, ident.groups), server_dns=None)
        path = layout.kubeconfig_for(ident.name)
        if not path.exists():
            path.write_text(yaml.safe_dump(kubeconfig(layout, ident.name)))
    layout.kubeconfig.write_text(layout.kubeconfig_for("admin").read_text())
