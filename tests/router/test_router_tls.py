"""HTTPS on the router's port: served, refused in plain HTTP, renewed in place; peers polled over it."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import os
import socket
import ssl
import sys
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from xpyd_http.messages import Reply, Request, Routes
from xpyd_http.server import Server
from xpyd_router.cli import main
from xpyd_router.http.tls import TlsFiles, leaf_pem
from xpyd_router.loadshare import PATH, LoadShare
from xpyd_router.policy.registry import make_policy
from xpyd_router.pool import WorkerPool, WorkerSpec

pytestmark = pytest.mark.timeout(30)
XPYD = str(Path(sys.executable).with_name("xpyd"))
Key = ec.EllipticCurvePrivateKey


def make_cert(
    name: str, issuer: tuple[x509.Certificate, Key] | None = None, ca: bool = False
) -> tuple[x509.Certificate, Key]:
    """A certificate for 127.0.0.1 named `name`: self-signed, or signed by `issuer`."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    signer_name, signer_key = (issuer[0].subject, issuer[1]) if issuer else (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(signer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        builder = builder.add_extension(san, critical=False)
    return builder.sign(signer_key, hashes.SHA256()), key


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def swap(path: Path, data: bytes) -> None:
    """Replace the file the way the kubelet updates a Secret volume: a new file moved over the old."""
    tmp = path.with_suffix(".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def install(folder: Path, pair: tuple[x509.Certificate, Key], chain: bytes = b"") -> tuple[str, str]:
    cert, key = folder / "tls.crt", folder / "tls.key"
    swap(cert, pem(pair[0]) + chain)
    swap(key, key_pem(pair[1]))
    return str(cert), str(key)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def ok(_: Request) -> Reply:
    return Reply(200, b'{"status":"ok"}')


async def serving(routes: Routes, tls: TlsFiles) -> Server:
    server = Server(routes, header_timeout=2.0)
    await server.listen("127.0.0.1", 0, tls=tls.server)
    return server


def trusting(cert: x509.Certificate) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=pem(cert).decode())
    ctx.check_hostname = False
    return ctx


async def served_cert(port: int) -> bytes:
    """The DER certificate a fresh handshake gets."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        assert isinstance(der, bytes)
        return der
    finally:
        writer.close()


def der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


async def test_https_is_served_and_plain_http_is_cut_off(tmp_path: Path) -> None:
    pair = make_cert("router")
    tls = TlsFiles(*install(tmp_path, pair))
    server = await serving({("GET", "/health"): ok}, tls)
    url = f"127.0.0.1:{server.port}/health"
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"https://{url}", ssl=trusting(pair[0])) as resp:
                assert resp.status == 200
            with pytest.raises(aiohttp.ClientError):  # plain HTTP: the handshake fails, the connection closes
                async with s.get(f"http://{url}", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    await resp.read()
            async with s.get(f"https://{url}", ssl=trusting(pair[0])) as resp:  # and the router serves on
                assert resp.status == 200
        assert tls.server.minimum_version == ssl.TLSVersion.TLSv1_2
    finally:
        await server.close(1.0)


async def test_a_renewed_certificate_is_served_without_dropping_connections(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = make_cert("first"), make_cert("second")
    clock = Clock()
    tls = TlsFiles(*install(tmp_path, first), check_every=5.0, clock=clock)
    server = await serving({("GET", "/health"): ok}, tls)
    try:
        assert await served_cert(server.port) == der(first[0])
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
            url, trust = f"https://127.0.0.1:{server.port}/health", trusting(first[0])
            async with s.get(url, ssl=trust) as resp:  # a keep-alive connection on the first
                assert resp.status == 200
            install(tmp_path, second)
            assert not tls.refresh()  # not looked at before check_every
            clock.now = 5.0
            assert tls.refresh() and tls.reloads == 1
            assert await served_cert(server.port) == der(second[0])
            assert tls.client.cert_store_stats()["x509"] == 2  # peers: the renewed leaf and the one before
            async with s.get(url, ssl=trust) as resp:  # the open connection (first certificate) carries on
                assert resp.status == 200
        # a broken renewal (key of another certificate): the last good pair stays, one warning
        swap(tmp_path / "tls.crt", pem(make_cert("third")[0]))
        clock.now = 10.0
        with caplog.at_level(logging.WARNING, "xpyd_router.http.tls"):
            assert not tls.refresh()
            clock.now = 15.0
            assert not tls.refresh()  # unchanged since: no second warning
        assert len([r for r in caplog.records if "still serving the previous one" in r.message]) == 1
        assert await served_cert(server.port) == der(second[0])
    finally:
        await server.close(1.0)


async def handshake(port: int, ctx: ssl.SSLContext) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    except ssl.SSLError:
        return False
    writer.close()
    return True


async def test_peers_trust_the_serving_leaf_or_the_ca(tmp_path: Path) -> None:
    ca = make_cert("ca", ca=True)
    ours, sibling = make_cert("router", issuer=ca), make_cert("other-service", issuer=ca)
    (tmp_path / "ours").mkdir()
    (tmp_path / "sibling").mkdir()
    cert, key = install(tmp_path / "ours", ours, chain=pem(ca[0]))
    assert leaf_pem((tmp_path / "ours" / "tls.crt").read_text()).encode() == pem(ours[0])  # the leaf, not the issuer
    server = await serving({}, TlsFiles(cert, key))
    other = await serving({}, TlsFiles(*install(tmp_path / "sibling", sibling, chain=pem(ca[0]))))
    try:
        ca_file = tmp_path / "ours" / "ca.crt"  # not in the Secret: the serving certificate is the anchor
        pinned = TlsFiles(cert, key, str(ca_file)).client
        assert await handshake(server.port, pinned)
        assert not await handshake(other.port, pinned)  # same CA, another certificate: not a replica
        ca_file.write_bytes(pem(ca[0]))  # ca.crt in the Secret: whatever that CA signed
        by_ca = TlsFiles(cert, key, str(ca_file)).client
        assert await handshake(server.port, by_ca)
        assert await handshake(other.port, by_ca)
    finally:
        await server.close(1.0)
        await other.close(1.0)


async def test_peers_poll_each_other_over_https(tmp_path: Path) -> None:
    pair = make_cert("router")
    tls = TlsFiles(*install(tmp_path, pair))
    pool = WorkerPool(make_policy("least-loaded"), 256)
    pool.set_workers([WorkerSpec("http://127.0.0.1:9001", "worker")])
    pool.workers["http://127.0.0.1:9001"].inflight = 3
    served = LoadShare(pool, [], api_key="k")
    server = await serving({("GET", PATH): served.handle}, tls)
    try:
        other = WorkerPool(make_policy("least-loaded"), 256)
        other.set_workers([WorkerSpec("http://127.0.0.1:9001", "worker")])
        peer = f"http://127.0.0.1:{server.port}"  # as discovery names it
        polling = LoadShare(other, [peer], api_key="k", tls=tls.peer_context)
        assert polling.peers == [f"https://127.0.0.1:{server.port}"]
        async with aiohttp.ClientSession() as s:
            await polling._poll(s, polling.peers[0])
        assert list(polling.reports) == polling.peers
        # a peer serving another certificate (not ours, no CA given) is not believed
        (tmp_path / "other").mkdir()
        stranger = TlsFiles(*install(tmp_path / "other", make_cert("other")))
        fake = await serving({("GET", PATH): served.handle}, stranger)
        try:
            polling.set_peers([f"http://127.0.0.1:{fake.port}"])
            async with aiohttp.ClientSession() as s:
                await polling._poll(s, polling.peers[0])
            assert polling.reports == {}
        finally:
            await fake.close(1.0)
    finally:
        await server.close(1.0)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tls-cert-file", "c.pem"], "--tls-cert-file and --tls-key-file go together"),
        (["--tls-key-file", "k.pem"], "--tls-cert-file and --tls-key-file go together"),
        (["--tls-ca-file", "ca.pem"], "--tls-ca-file needs --tls-cert-file"),
        (
            ["--tls-cert-file", "/nonexistent/c.pem", "--tls-key-file", "/nonexistent/k.pem"],
            "cannot load --tls-cert-file",
        ),
        (["--tls-cert-file", "{cert}", "--tls-key-file", "{other}"], "give a PEM certificate and its private key"),
    ],
)
def test_bad_tls_flags_are_named(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cert, _ = install(tmp_path, make_cert("router"))
    other = tmp_path / "other.key"
    other.write_bytes(key_pem(make_cert("other")[1]))
    argv = ["--decode", "http://127.0.0.1:9"] + [f.format(cert=cert, other=other) for f in flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


async def test_the_router_command_serves_https(tmp_path: Path) -> None:
    pair = make_cert("router")
    cert, key = install(tmp_path, pair)
    (tmp_path / "api-key").write_text("k1\nk2\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = ["router", "--decode", "http://127.0.0.1:9", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--tls-cert-file", cert, "--tls-key-file", key, "--api-key-file", str(tmp_path / "api-key")]
    proc = await asyncio.create_subprocess_exec(XPYD, *argv, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert b"HTTPS" in line
        async with aiohttp.ClientSession() as s:
            async with s.get(f"https://127.0.0.1:{port}/metrics", ssl=trusting(pair[0])) as resp:
                assert resp.status == 200
            for bearer, status in (("k2", 503), ("nope", 401)):  # past the key, no ready worker: 503
                headers = {"Authorization": f"Bearer {bearer}"}
                async with s.get(f"https://127.0.0.1:{port}/v1/models", ssl=trusting(pair[0]), headers=headers) as resp:
                    assert resp.status == status
    finally:
        proc.terminate()
        await proc.wait()
