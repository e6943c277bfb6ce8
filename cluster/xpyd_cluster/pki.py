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
# the controller manager and scheduler get their built-in RBAC identities.
CLIENTS = (
    Identity("admin", "kubernetes-admin", ("system:masters",)),
    Identity("kube-controller-manager", "system:kube-controller-manager"),
    Identity("kube-scheduler", "system:kube-scheduler"),
    Identity("kwok", "xpyd:kwok", ("system:masters",)),
    Identity("kubelet", "xpyd:process-kubelet", ("system:masters",)),
    Identity("prometheus", "xpyd:prometheus"),
)


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


def _issue(layout: Layout, name: str, subject: x509.Name, server: bool) -> None:
    ca_key = serialization.load_pem_private_key((layout.pki / "ca.key").read_bytes(), None)
    ca = x509.load_pem_x509_certificate((layout.pki / "ca.crt").read_bytes())
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _key()
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = _builder(subject, ca.subject, key).add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in API_SANS_DNS]
        sans += [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    (layout.pki / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(layout.pki / f"{name}.key", key)


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
        _issue(layout, "apiserver", _name("kube-apiserver"), server=True)
    if not (pki / "sa.key").exists():
        sa = _key()
        _write_key(pki / "sa.key", sa)
        (pki / "sa.pub").write_bytes(
            sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
    for ident in CLIENTS:
        if not (pki / f"{ident.name}.crt").exists():
            _issue(layout, ident.name, _name(ident.user, ident.groups), server=False)
        path = layout.kubeconfig_for(ident.name)
        if not path.exists():
            path.write_text(yaml.safe_dump(kubeconfig(layout, ident.name)))
    layout.kubeconfig.write_text(layout.kubeconfig_for("admin").read_text())
