"""HTTPS on the router's port: the serving certificate, reloaded when its files change, and the peers' trust.

cert-manager renews a certificate into its Secret and the kubelet swaps the mounted files in place;
the router looks at their stat every `check_every` seconds and, when they changed, loads the new
pair into the serving SSLContext (load_cert_chain): new handshakes get the new certificate, open
connections keep theirs, nothing is dropped. A pair that does not load (a half-written file, a key
that does not match) is tried on a scratch context first and never reaches the serving one: the old
certificate stays, with one warning per change.

Replicas poll each other (xpyd_router.loadshare) at their pod IPs, which a certificate rarely names,
so the peers' client context checks the chain but not the host name. What it trusts: the CA bundle
given (--tls-ca-file, the Secret's ca.crt) when that file exists and is not empty, so any
certificate of that CA passes; else the serving certificate itself (its first PEM block, the leaf;
OpenSSL's partial-chain flag makes a leaf a trust anchor), and the one before it after a renewal,
so only the replicas' own certificate passes.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from pathlib import Path

from xpyd_router.http.access import Stamp, file_stamp

log = logging.getLogger("xpyd_router.http.tls")
CHECK_S = 5.0  # at most this often the certificate files' stat is looked at
PEM_END = "-----END CERTIFICATE-----"


def server_context(cert: str, key: str) -> ssl.SSLContext:
    """TLS 1.2 or later, the certificate and key loaded (ssl.SSLError or OSError if they do not)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


def leaf_pem(text: str) -> str:
    """The first certificate of a PEM chain (the leaf), or '' if there is none."""
    end = text.find(PEM_END)
    start = text.rfind("-----BEGIN CERTIFICATE-----", 0, end) if end >= 0 else -1
    return text[start : end + len(PEM_END)] + "\n" if start >= 0 else ""


def _read(path: str | None) -> str:
    if path is None:
        return ""
    try:
        return Path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""


class TlsFiles:
    """The serving context for `cert`/`key`, kept current, and the client context peers are polled with."""

    def __init__(
        self,
        cert: str,
        key: str,
        ca: str | None = None,
        check_every: float = CHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cert, self.key, self.ca = cert, key, ca
        self.check_every = check_every
        self._clock = clock
        self._stamp = self._stamps()
        self.server = server_context(cert, key)  # raises at start-up: a command-line error
        self.reloads = 0
        self._anchors: list[str] = []  # the PEM the peers' certificates are checked against, newest first
        self.client = self._client()
        self._due = clock() + check_every

    def _stamps(self) -> tuple[Stamp, ...]:
        return (file_stamp(self.cert), file_stamp(self.key), file_stamp(self.ca) if self.ca else None)

    def _client(self) -> ssl.SSLContext:
        """The peers' context: chain checked against the CA bundle, else against this (and the last) leaf."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = False  # peers are reached at pod IPs, which the certificate need not name
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # an anchor need not be a root: a leaf, an intermediate
        ca = _read(self.ca)
        anchor = ca + "\n" if PEM_END in ca else leaf_pem(_read(self.cert))
        if anchor and anchor not in self._anchors:
            self._anchors = [anchor, *self._anchors][:2]  # the last one too: peers not yet renewed still pass
        for pem in self._anchors:
            try:
                ctx.load_verify_locations(cadata=pem)
            except ssl.SSLError:
                log.warning("cannot load a peer trust anchor from %s; skipped", self.ca or self.cert)
        return ctx

    def refresh(self) -> bool:
        """Reload the pair if its files changed (at most every `check_every` seconds); True when it did."""
        now = self._clock()
        if now < self._due:
            return False
        self._due = now + self.check_every
        stamp = self._stamps()
        if stamp == self._stamp:
            return False
        try:
            server_context(self.cert, self.key)  # a scratch context first: a bad pair never reaches the live one
            self.server.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:  # once per change: the next change is tried again
            self._stamp = stamp
            log.warning(
                "cannot load the renewed certificate %s with key %s (%s); still serving the previous one",
                self.cert, self.key, exc,
            )  # fmt: skip
            return False
        self._stamp = stamp
        self.client = self._client()
        self.reloads += 1
        log.info("reloaded the TLS certificate %s", self.cert)
        return True

    def peer_context(self) -> ssl.SSLContext:
        self.refresh()
        return self.client

    async def run(self, _: object = None) -> None:
        """Look at the files every `check_every` seconds, forever (a background job of the router)."""
        while True:
            await asyncio.sleep(self.check_every)
            self.refresh()
