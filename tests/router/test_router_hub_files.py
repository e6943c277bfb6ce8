"""`--tokenizer hf:REPO`: the files from a loopback fake of the Hugging Face Hub, and every way that fails.

A failure never stops the router: one warning line naming the repository and the cause, then no
tokenizer (byte-block keys), exactly as --tokenizer none. A copy cached by an earlier start serves
when the hub is down.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chat_models import CONFIGS, write_tokenizer  # type: ignore[import-not-found]  # tests/router is on sys.path
from prometheus_client import CollectorRegistry, generate_latest

from fakehub import FakeHub, Reply, serve  # type: ignore[import-not-found]  # tests/ is on sys.path
from xpyd_router.metrics import RouterMetrics
from xpyd_router.tokens import hub_files
from xpyd_router.tokens.engine import HfTokenizer, load_hub_tokenizer
from xpyd_router.tokens.hub_files import HubError, HubOptions, HubRef, fetch, parse_spec

REPO = "org/model"
SPEC = f"hf:{REPO}"
CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}


@pytest.fixture(scope="module")
def repo_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A model's files: a real tokenizer.json, Qwen2.5's tokenizer_config.json."""
    tok = write_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    return {
        "tokenizer.json": tok.read_bytes(),
        "tokenizer_config.json": json.dumps(CONFIGS["qwen2.5-instruct"]).encode(),
    }


@pytest.fixture
def hubs(repo_files: dict[str, bytes]) -> Iterator[list[FakeHub]]:
    """hubs[0]: the hub holding org/model at main; hubs[1]: a second host (a CDN) with nothing."""
    servers, out = [], []
    for files in ({f"{REPO}/main/{k}": v for k, v in repo_files.items()}, {}):
        hub = FakeHub(files=files)
        servers.append(serve(hub))
        out.append(hub)
    yield out
    for server in servers:
        server.shutdown()
        server.server_close()


def _options(tmp_path: Path, endpoint: str, **kw: Any) -> HubOptions:
    return HubOptions(endpoint=endpoint, cache_root=tmp_path / "hf", backoff_s=0.01, **kw)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_fetch_and_load(tmp_path: Path, hubs: list[FakeHub], caplog: pytest.LogCaptureFixture) -> None:
    tok = load_hub_tokenizer(SPEC, options=_options(tmp_path, hubs[0].url))
    assert isinstance(tok, HfTokenizer) and tok.name == SPEC
    assert tok.chat_template is not None and "<|im_start|>user" in tok.chat_template.render(CHAT)
    assert _warnings(caplog) == []
    stored = hub_files.cache_dir(HubRef(REPO), _options(tmp_path, hubs[0].url))
    assert sorted(p.name for p in stored.iterdir()) == [
        "chat_template.jinja.absent",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    paths = [p for p, _ in hubs[0].seen]
    assert paths == [
        f"/{REPO}/resolve/main/{n}" for n in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
    ]


def test_the_token_goes_to_the_hub_and_never_to_another_host(tmp_path: Path, hubs: list[FakeHub]) -> None:
    hub, cdn = hubs
    cdn.files["blob"] = hub.files[f"{REPO}/main/tokenizer.json"]
    hub.replies["tokenizer.json"] = [Reply(302, headers={"Location": f"{cdn.url}/blob"})]  # LFS: off to the CDN
    hub.replies["tokenizer_config.json"] = [Reply(307, headers={"Location": "/elsewhere/tokenizer_config.json"})]
    hub.files["elsewhere/tokenizer_config.json"] = b"{}"
    fetched = fetch(HubRef(REPO), _options(tmp_path, hub.url, token="hf_secret"))
    assert (fetched.directory / "tokenizer.json").read_bytes() == cdn.files["blob"]
    assert dict(hub.seen)[f"/{REPO}/resolve/main/tokenizer.json"] == "Bearer hf_secret"
    assert dict(hub.seen)["/elsewhere/tokenizer_config.json"] == "Bearer hf_secret"  # same host
    assert cdn.seen == [("/blob", None)]


@pytest.mark.parametrize(
    ("replies", "want"),
    [
        ({"tokenizer.json": [Reply(401, headers={"X-Error-Code": "GatedRepo"})]}, "HTTP 401: gated or private"),
        ({"tokenizer.json": [Reply(403)]}, "HTTP 403: no access"),
        ({"tokenizer.json": [Reply(404, headers={"X-Error-Code": "RepoNotFound"})]}, "tokenizer.json (HTTP 404: Repo"),
        ({"tokenizer.json": [Reply(404)]}, "cannot fetch tokenizer.json (HTTP 404)"),
        ({"tokenizer_config.json": [Reply(404, headers={"X-Error-Code": "RevisionNotFound"})]}, "RevisionNotFound"),
        ({"tokenizer.json": [Reply(503)]}, "cannot fetch tokenizer.json (HTTP 503)"),  # after 3 tries
        ({"tokenizer.json": [Reply(200, b"not json")]}, "cannot load"),
        ({"tokenizer_config.json": [Reply(200, b"[1, 2]")]}, "is not a JSON object"),
    ],
)
def test_a_failure_is_one_warning_and_no_tokenizer(
    tmp_path: Path, hubs: list[FakeHub], replies: dict[str, list[Reply]], want: str, caplog: pytest.LogCaptureFixture
) -> None:
    hubs[0].replies.update(replies)
    assert load_hub_tokenizer(SPEC, options=_options(tmp_path, hubs[0].url)) is None
    [line] = _warnings(caplog)
    assert line.startswith(f"--tokenizer {SPEC}: ") and want in line and "\n" not in line
    assert line.endswith("routing without a tokenizer (byte-block prefix keys, engine KV events unused)")


def test_server_errors_are_retried(tmp_path: Path, hubs: list[FakeHub]) -> None:
    hubs[0].replies["tokenizer.json"] = [
        Reply(503),
        Reply(429),
        Reply(200, hubs[0].files[f"{REPO}/main/tokenizer.json"]),
    ]
    assert load_hub_tokenizer(SPEC, options=_options(tmp_path, hubs[0].url)) is not None
    assert [p for p, _ in hubs[0].seen].count(f"/{REPO}/resolve/main/tokenizer.json") == 3


def test_a_hub_that_never_answers_is_given_up_on_in_time(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        assert load_hub_tokenizer(SPEC, options=_options(tmp_path, endpoint, deadline_s=1.0)) is None
        assert time.monotonic() - start < 4.0  # the deadline, plus in_thread's 1 s of grace, plus a busy machine
    [line] = _warnings(caplog)
    # Either bound may end it: the socket's read timeout (the fetch's own deadline) or, on a machine busy
    # enough that building the client ate the grace, in_thread's join. Both are one line naming the spec.
    assert SPEC in line and ("timed out at 127.0.0.1" in line or "no answer within 1s" in line), line


def test_an_unreachable_hub(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once this block ends: nothing listens there
    assert load_hub_tokenizer(SPEC, options=_options(tmp_path, f"http://127.0.0.1:{port}")) is None
    [line] = _warnings(caplog)
    assert f"cannot reach 127.0.0.1:{port}" in line


def test_a_later_start_uses_the_cache_when_the_hub_is_down(
    tmp_path: Path, hubs: list[FakeHub], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_ENDPOINT", hubs[0].url)
    first = load_hub_tokenizer(SPEC)
    assert first is not None and _warnings(caplog) == []
    hubs[0].replies["tokenizer.json"] = [Reply(500)]  # down (and a mirror's 5xx is retried, then given up)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{s.getsockname()[1]}")
    second = load_hub_tokenizer(SPEC)
    assert second is not None and second.chat_template is not None
    assert (second.encode("Paris") == first.encode("Paris")).all()
    [line] = _warnings(caplog)
    assert "cannot reach" in line and "using the copy cached at" in line and str(tmp_path / "home") in line


def test_a_commit_is_read_from_the_cache_without_asking(tmp_path: Path, hubs: list[FakeHub]) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    hub = hubs[0]
    for k, v in list(hub.files.items()):
        hub.files[k.replace("/main/", f"/{commit}/")] = v
    options = _options(tmp_path, hub.url)
    assert fetch(HubRef(REPO, commit), options).note is None
    asked = len(hub.seen)
    assert fetch(HubRef(REPO, commit), options).note is None and len(hub.seen) == asked
    fetch(HubRef(REPO), options)
    assert len(hub.seen) == asked + 3  # a branch may move: asked again


def test_offline(tmp_path: Path, hubs: list[FakeHub], caplog: pytest.LogCaptureFixture) -> None:
    offline = _options(tmp_path, hubs[0].url, offline=True)
    assert load_hub_tokenizer(SPEC, options=offline) is None
    assert "HF_HUB_OFFLINE is set and nothing is cached" in _warnings(caplog)[0]
    assert load_hub_tokenizer(SPEC, options=_options(tmp_path, hubs[0].url)) is not None
    caplog.clear()
    assert load_hub_tokenizer(SPEC, options=offline) is not None
    assert [p for p, _ in hubs[0].seen].count(f"/{REPO}/resolve/main/tokenizer.json") == 1


def test_size_cap(tmp_path: Path, hubs: list[FakeHub], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub_files, "MAX_BYTES", 100)
    with pytest.raises(HubError, match="tokenizer.json is .* over the 100 byte limit"):
        fetch(HubRef(REPO), _options(tmp_path, hubs[0].url))


def test_an_unwritable_cache_still_loads(tmp_path: Path, hubs: list[FakeHub], caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "hf").write_text("a file where the cache directory should be")
    assert load_hub_tokenizer(SPEC, options=_options(tmp_path, hubs[0].url)) is not None
    [line] = _warnings(caplog)
    assert "cannot write the cache" in line and "for this run" in line


@pytest.mark.parametrize(
    ("spec", "ref"),
    [
        ("hf:meta-llama/Llama-3.1-8B-Instruct", HubRef("meta-llama/Llama-3.1-8B-Instruct", "main")),
        ("hf:gpt2", HubRef("gpt2", "main")),
        ("hf:Qwen/Qwen2.5-7B-Instruct@v1.0", HubRef("Qwen/Qwen2.5-7B-Instruct", "v1.0")),
        ("hf:org/m@refs/pr/3", HubRef("org/m", "refs/pr/3")),
    ],
)
def test_specs(spec: str, ref: HubRef) -> None:
    assert parse_spec(spec) == ref


@pytest.mark.parametrize(
    "spec", ["hf:", "hf:a/b/c", "hf:org/a..b", "hf:org/m@", "hf:org/m@a b", "hf:org/m@..", "hf:-x"]
)
def test_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError, match=f"--tokenizer {spec}"):
        parse_spec(spec)


def test_revision_and_cache_paths_stay_inside_the_cache(tmp_path: Path) -> None:
    options = _options(tmp_path, "http://127.0.0.1:9")
    where = hub_files.cache_dir(parse_spec("hf:org/m@refs/pr/3"), options)
    assert where.parent.parent == tmp_path / "hf" / "xpyd-router" and where.name == "refs%2Fpr%2F3"


def test_options_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in (("HF_ENDPOINT", "http://127.0.0.1:9/"), ("HF_TOKEN", "t"), ("HF_HOME", str(tmp_path))):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    options = HubOptions.from_env()
    assert (options.endpoint, options.token, options.cache_root, options.offline) == (
        "http://127.0.0.1:9",
        "t",
        tmp_path,
        True,
    )
    for name in ("HF_ENDPOINT", "HF_TOKEN", "HF_HOME", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", "old")
    options = HubOptions.from_env()
    assert (options.endpoint, options.token, options.offline) == ("https://huggingface.co", "old", False)
    assert options.cache_root.name == "xpyd-hf"


def test_a_bad_endpoint(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert load_hub_tokenizer(SPEC, options=_options(tmp_path, "ftp://mirror")) is None
    assert "HF_ENDPOINT must be an http(s) URL" in _warnings(caplog)[0]


@pytest.mark.parametrize(("spec", "loaded", "value"), [("hf:org/model", False, "0.0"), ("emulator", True, "1.0")])
def test_metrics_say_whether_a_tokenizer_is_in_use(spec: str, loaded: bool, value: str) -> None:
    metrics = RouterMetrics("d", CollectorRegistry())
    metrics.tokenizer(spec, loaded)
    text = generate_latest(metrics.registry).decode()
    assert f'xpyd_router_tokenizer_loaded{{deployment="d",tokenizer="{spec}"}} {value}' in text
