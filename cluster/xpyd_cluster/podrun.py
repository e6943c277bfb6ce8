"""Runs one pod as a local process: start, probe, restart, report status, stop within the grace period."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
from lightkube import AsyncClient
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod, ServiceAccount

from .daemons import MARKER
from .podspec import LaunchPlan, Probe

log = logging.getLogger("xpyd.kubelet")

TOKEN_SECONDS = 3600
_MOUNT = 'mkdir -p "$0" && mount --bind "$1" "$0" && shift && exec "$@"'


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodRunner:
    """Supervises the process of one pod until it is told to stop."""

    def __init__(
        self,
        client: AsyncClient,
        pod: dict[str, Any],
        plan: LaunchPlan,
        ip: str,
        workdir: Path,
        ca: Path,
        marker: str,
    ) -> None:
        meta = pod["metadata"]
        self.client, self.plan, self.ip, self.workdir, self.ca, self.marker = (
            client,
            plan,
            ip,
            workdir,
            ca,
            marker,
        )
        self.name, self.namespace, self.uid = meta["name"], meta["namespace"], meta["uid"]
        self.sa = pod["spec"].get("serviceAccountName") or "default"
        container = pod["spec"]["containers"][0]
        self.container, self.image = container["name"], container.get("image", "")
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.last_state: dict[str, Any] = {}
        self.ready = False
        self.started_at = now()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"pod {self.namespace}/{self.name}")

    async def stop(self, grace: float, hook: bool = False) -> None:
        """Run the preStop hook (with `hook`), SIGTERM the process group, SIGKILL once `grace` seconds have passed
        (a hook that overruns them gets 2 s more, as a kubelet gives it), and end supervision."""
        self._stopping.set()
        proc = self.proc
        deadline = asyncio.get_running_loop().time() + max(grace, 0.1)
        if hook and self.plan.pre_stop and proc is not None and proc.returncode is None:
            await self._pre_stop(max(grace, 0.1))
            deadline = max(deadline, asyncio.get_running_loop().time() + 2.0)
        if proc is not None and proc.returncode is None:
            _signal(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout=max(deadline - asyncio.get_running_loop().time(), 0.1))
            except TimeoutError:
                _signal(proc.pid, signal.SIGKILL)
                await proc.wait()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _pre_stop(self, limit: float) -> None:
        """The exec preStop hook, in the container's environment, for `limit` seconds at most; its output goes to
        the container's log. A failing hook is logged, and the container stopped all the same."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"),
               **self.plan.env}  # fmt: skip
        with (self.workdir / "container.log").open("ab") as out:
            hook = await asyncio.create_subprocess_exec(
                *self.plan.pre_stop, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=out,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True, cwd=str(self.workdir),
            )  # fmt: skip
        try:
            code = await asyncio.wait_for(hook.wait(), timeout=limit)
        except TimeoutError:
            _signal(hook.pid, signal.SIGKILL)
            await hook.wait()
            log.warning("preStop hook of %s/%s ran past %.0fs", self.namespace, self.name, limit)
            return
        if code != 0:
            log.warning("preStop hook of %s/%s exited with %s", self.namespace, self.name, code)

    async def _supervise(self) -> None:
        backoff = 1.0
        while not self._stopping.is_set():
            try:
                await self._launch()
            except Exception as exc:  # a pod that cannot start is reported, not fatal to the kubelet
                log.exception("pod %s/%s failed to start", self.namespace, self.name)
                await self._report(waiting=("CreateContainerError", str(exc)))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            assert self.proc is not None
            await self._report()
            probes = asyncio.create_task(self._probe_loop())
            code = exit_code(await self.proc.wait())
            probes.cancel()
            if self._stopping.is_set():
                return
            log.warning("pod %s/%s exited with %s", self.namespace, self.name, code)
            if self.plan.restart == "Never" or (self.plan.restart == "OnFailure" and code == 0):
                await self._report(terminated=code)
                return
            # restartCount > 0 is what LeaderWorkerSet's RecreateGroupOnPodRestart reacts to (phase stays Running)
            self.restarts += 1
            self.ready = False
            self.last_state = _terminated(code, self.started_at)
            await self._report(waiting=("CrashLoopBackOff", f"exit code {code}"))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)

    async def _launch(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = list(self.plan.argv)
        path = ":".join([*self.plan.path, str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])
        env = {
            "PATH": path,
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            MARKER: self.marker,
            **self.plan.env,
        }
        if self.plan.sa_mount:
            sa_dir = await self._service_account_files()
            argv = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                _MOUNT,
                self.plan.sa_mount,
                str(sa_dir),
                *argv,
            ]
        log_file = (self.workdir / "container.log").open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log_file,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            cwd=str(self.workdir),
        )
        log_file.close()
        (self.workdir / "pid").write_text(str(self.proc.pid))
        self.started_at = now()
        self.ready = self.plan.readiness is None

    async def _service_account_files(self) -> Path:
        """A bound, expiring token from the TokenRequest API plus ca.crt and namespace, like a projected volume."""
        sa_dir = self.workdir / "serviceaccount"
        sa_dir.mkdir(parents=True, exist_ok=True)
        token = ServiceAccount.Token(
            metadata=ObjectMeta(name=self.sa, namespace=self.namespace),
            spec=TokenRequestSpec(
                audiences=[],
                expirationSeconds=TOKEN_SECONDS,
                boundObjectRef=BoundObjectReference(kind="Pod", apiVersion="v1", name=self.name, uid=self.uid),
            ),
        )
        result = await self.client.create(token, self.sa, namespace=self.namespace)
        assert result.status is not None
        if not result.status.token:
            raise RuntimeError(f"TokenRequest for {self.namespace}/{self.sa} returned no token")
        _write(sa_dir / "token", result.status.token)
        _write(sa_dir / "ca.crt", self.ca.read_text())
        _write(sa_dir / "namespace", self.namespace)
        return sa_dir

    async def _probe_loop(self) -> None:
        if not await self._startup():
            return
        readiness, liveness = self.plan.readiness, self.plan.liveness
        if readiness is None and liveness is None:
            return
        first = 0.0 if self.plan.startup else min(p.initial_delay for p in (readiness, liveness) if p is not None)
        await asyncio.sleep(first)
        period = min(p.period for p in (readiness, liveness) if p is not None)
        failures = unready = 0
        refresh_at = asyncio.get_running_loop().time() + TOKEN_SECONDS * 0.8
        async with aiohttp.ClientSession() as session:
            while True:
                if readiness is not None:
                    # Ready on one success; not ready after failureThreshold failures in a row, as a kubelet has it
                    # (a busy engine may answer one probe late without leaving its Service).
                    unready = 0 if await _check(session, self.ip, readiness) else unready + 1
                    ok = unready == 0 or (self.ready and unready < readiness.failure_threshold)
                    if ok != self.ready:
                        self.ready = ok
                        await self._report()
                if liveness is not None:
                    failures = 0 if await _check(session, self.ip, liveness) else failures + 1
                    if failures >= liveness.failure_threshold and self.proc is not None:
                        log.warning("pod %s/%s failed its liveness probe", self.namespace, self.name)
                        _signal(self.proc.pid, signal.SIGKILL)
                        return
                if self.plan.sa_mount and asyncio.get_running_loop().time() > refresh_at:
                    await self._service_account_files()
                    refresh_at += TOKEN_SECONDS * 0.8
                await asyncio.sleep(period if readiness is None or self.ready else min(period, 1.0))

    async def _startup(self) -> bool:
        """The startupProbe: readiness and liveness wait for it. Polled every second (as readiness is while not
        ready, so pods come up promptly), its deadline still the kubelet's: delay + period x failureThreshold.
        False when it failed and the process was killed (the supervisor restarts it)."""
        startup = self.plan.startup
        if startup is None:
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + startup.initial_delay + startup.period * startup.failure_threshold
        await asyncio.sleep(startup.initial_delay)
        async with aiohttp.ClientSession() as session:
            while not await _check(session, self.ip, startup):
                if loop.time() > deadline and self.proc is not None:
                    log.warning("pod %s/%s failed its startup probe", self.namespace, self.name)
                    _signal(self.proc.pid, signal.SIGKILL)
                    return False
                await asyncio.sleep(min(startup.period, 1.0))
        return True

    async def _report(self, waiting: tuple[str, str] | None = None, terminated: int | None = None) -> None:
        ready = self.ready and waiting is None and terminated is None
        if waiting is not None:
            state: dict[str, Any] = {"waiting": {"reason": waiting[0], "message": waiting[1][:500]}}
        elif terminated is not None:
            state = _terminated(terminated, self.started_at)
        else:
            state = {"running": {"startedAt": self.started_at}}
        phase = "Running" if terminated is None else ("Succeeded" if terminated == 0 else "Failed")
        flag = "True" if ready else "False"
        status = {
            "phase": phase,
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": self.started_at,
            "conditions": [
                {
                    "type": "PodReadyToStartContainers",
                    "status": "True",
                    "lastTransitionTime": self.started_at,
                },
                {"type": "Initialized", "status": "True", "lastTransitionTime": self.started_at},
                {"type": "ContainersReady", "status": flag, "lastTransitionTime": now()},
                {"type": "Ready", "status": flag, "lastTransitionTime": now()},
            ],
            "containerStatuses": [
                {
                    "name": self.container,
                    "image": self.image,
                    "imageID": self.image,
                    "containerID": f"xpyd://{self.proc.pid if self.proc else 0}",
                    "ready": ready,
                    "started": waiting is None and terminated is None,
                    "restartCount": self.restarts,
                    "state": state,
                    "lastState": self.last_state,
                }
            ],
        }
        try:
            await self.client.patch(Pod.Status, self.name, {"status": status}, namespace=self.namespace)
        except Exception as exc:  # the pod may be gone already; the watch loop reconciles
            log.info("status of %s/%s not written: %s", self.namespace, self.name, exc)


async def _check(session: aiohttp.ClientSession, ip: str, probe: Probe) -> bool:
    try:
        if probe.path is None:
            _, writer = await asyncio.wait_for(asyncio.open_connection(ip, probe.port), probe.timeout)
            writer.close()
            return True
        url = f"http://{ip}:{probe.port}{probe.path}"
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=probe.timeout)) as resp:
            return 200 <= resp.status < 400
    except (OSError, TimeoutError, aiohttp.ClientError):
        return False


def exit_code(returncode: int) -> int:
    """A container's exit code as Kubernetes reports it: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _terminated(code: int, started_at: str) -> dict[str, Any]:
    reason = "Completed" if code == 0 else "Error"
    return {"terminated": {"exitCode": code, "reason": reason, "startedAt": started_at, "finishedAt": now()}}


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
