"""CPU cost of keying prompts by engine tokens and of applying engine KV events, per 4k-token prompt.

`python bench/router/kv_cost.py` prints microseconds per operation: the router's request keys
(byte blocks, the emulator's tokens, a Hugging Face BPE tokenizer trained here on the standard
library's sources, so nothing is downloaded), a 10-turn chat's requests after the first tokenized
through the segment cache (`xpyd_router.tokens.cache`) and whole, decoding and applying one
BlockStored of 256 blocks and 256 BlockRemoved, and the emulator's own tokenizing and block hashing.
"""

from __future__ import annotations

import argparse
import os
import platform
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from xpyd_emulator.kv_publisher import KVEventBatch, to_wire
from xpyd_emulator.tokens import block_hashes_text, token_ids
from xpyd_router.hashing import block_hashes
from xpyd_router.kv.block_keys import RequestKeys, token_block_keys
from xpyd_router.kv.engine_view import EngineView
from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.kv.wire import decode_batch
from xpyd_router.tokens.chat_template import ChatTemplate
from xpyd_router.tokens.engine import EmulatorTokenizer, HfTokenizer

WORDS = "the quick brown fox jumps over a lazy dog while routers count cached prefix blocks".split()  # noqa: SIM905
PROMPT = " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(3000))[:16_384]  # 16k characters: 4k emulator tokens
CHATML = (  # Qwen's template without tools: <|im_start|>role\ncontent<|im_end|>\n
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TURNS = 10


def per_call(fn: Callable[[], object], seconds: float = 0.5) -> float:
    """Microseconds per call, best of 3 runs of about `seconds` each."""
    fn()
    calls = max(1, int(seconds / max(1e-7, _once(fn))))
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def _once(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def hf_tokenizer(path: Path) -> HfTokenizer:
    """A 32k-token byte-level BPE trained on this Python's standard library (about what a model's costs)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if not path.exists():
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        files = sorted(str(p) for p in Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]
        tok.train(files, trainers.BpeTrainer(vocab_size=32_000, show_progress=False))
        tok.save(str(path))
    return HfTokenizer(str(path))


def chat_tokenizer(path: Path) -> HfTokenizer:
    """The BPE with ChatML's special tokens and template."""
    from tokenizers import Tokenizer

    chat_path = path.with_name(f"{path.stem}-chatml.json")
    if not chat_path.exists():
        tok = Tokenizer.from_file(str(path))
        tok.add_special_tokens(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
        tok.save(str(chat_path))
    return HfTokenizer(str(chat_path), chat_template=ChatTemplate(CHATML))


def chat_requests(tok: HfTokenizer) -> list[str]:
    """A 10-turn chat's requests, rendered: each resends the history (about 1,600 characters a turn,
    4k tokens by the last) and a new user message."""

    def text(turn: int, words: int) -> str:
        return " ".join(WORDS[(turn * 5 + i * 7) % len(WORDS)] for i in range(words))

    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    requests = []
    assert tok.chat_template is not None
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"Turn {turn}: {text(turn, 100)}"})
        requests.append(tok.chat_template.render({"messages": messages}))
        messages.append({"role": "assistant", "content": text(turn + 1, 200)})
    return requests


def chat_turns(tok: HfTokenizer, requests: list[str], cached: bool) -> float:
    """Microseconds per request 2-10 of the chat, best of 15 runs; the cache is emptied before each run
    and fed request 1, so each request finds what the one before it left."""
    best = float("inf")
    for run in range(20):  # the first runs take the self-check's first 32 whole encodes too: not counted
        tok.chat_segments.cache.clear()
        tok.encode_chat(requests[0])
        start = time.perf_counter()
        for text in requests[1:]:
            tok.encode_chat(text) if cached else tok.encode(text, False)
        if run >= 5:
            best = min(best, (time.perf_counter() - start) / (len(requests) - 1))
    return best * 1e6


def main() -> None:
    emu = RequestKeys(EmulatorTokenizer(), 16, 256, 4.0)
    rows: list[tuple[str, float]] = [
        ("router keys, byte blocks (no tokenizer)", per_call(lambda: block_hashes(PROMPT, 256))),
        ("router keys, emulator tokens (tokenize + key)", per_call(lambda: emu(PROMPT))),
        ("  of which tokenize", per_call(lambda: EmulatorTokenizer().encode(PROMPT))),
    ]
    p = argparse.ArgumentParser(description="CPU cost of engine-token keys and KV events, per prompt")
    p.add_argument(
        "--tokenizer",
        type=Path,
        default=Path(tempfile.gettempdir()) / "xpyd-bpe-32k.json",
        help="where the trained BPE tokenizer is kept between runs",
    )
    p.add_argument("--out", type=Path, help="also write the table as markdown, e.g. bench/results/kv-cost.md")
    args = p.parse_args()
    hf = hf_tokenizer(args.tokenizer)
    ids = hf.encode(PROMPT)
    rows.append(
        (
            f"router keys, HF BPE tokenizer ({len(ids)} tokens)",
            per_call(lambda: token_block_keys(hf.encode(PROMPT), 16)),
        )
    )
    rows.append(("  of which tokenize", per_call(lambda: hf.encode(PROMPT))))
    chat = chat_tokenizer(Path(hf.name))
    requests = chat_requests(chat)
    tokens = sum(len(chat.encode(t, False)) for t in requests[1:]) // (len(requests) - 1)
    assert chat.chat_segments.disabled is None
    rows.append(
        (
            f"{TURNS}-turn chat, requests 2-{TURNS} ({tokens} tokens on average): tokenize through the segment cache",
            chat_turns(chat, requests, cached=True),
        )
    )
    rows.append(("  the same, whole encode", chat_turns(chat, requests, cached=False)))
    stored = [("stored", block_hashes_text(PROMPT, 16), None, token_ids(PROMPT))]
    removed = [("removed", [h]) for h in block_hashes_text(PROMPT, 16)]
    stored_payload = msgspec.msgpack.encode(KVEventBatch(0.0, to_wire(stored, 16, False), 0))
    removed_payload = msgspec.msgpack.encode(KVEventBatch(0.0, to_wire(removed, 16, False), 0))

    def apply_both() -> None:
        view = EngineView("w", PrefixIndex(), 16)
        view.apply(decode_batch(stored_payload))
        view.apply(decode_batch(removed_payload))

    rows.append(
        (
            f"decode BlockStored, 256 blocks ({len(stored_payload)} bytes)",
            per_call(lambda: decode_batch(stored_payload)),
        )
    )
    rows.append(("decode + apply BlockStored and 256 BlockRemoved", per_call(apply_both)))
    rows.append(("emulator: tokenize + hash blocks", per_call(lambda: block_hashes_text(PROMPT, 16))))
    rows.append(
        (
            "emulator: encode one batch (BlockStored, 256 blocks)",
            per_call(lambda: msgspec.msgpack.encode(KVEventBatch(0.0, to_wire(stored, 16, False), 0))),
        )
    )
    print(f"prompt: {len(PROMPT)} characters, {len(token_ids(PROMPT))} emulator tokens")
    for name, micros in rows:
        print(f"{micros:10.1f} us  {name}")
    if args.out is not None:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        machine = f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
        lines = [
            "# CPU cost of engine-token keys and KV events",
            "",
            f"Measured {when} on {machine} by `.venv/bin/python bench/router/kv_cost.py --out"
            " bench/results/kv-cost.md`: best of 3 runs of about 0.5 s per row, one core, the machine shared.",
            f"The prompt: {len(PROMPT):,} characters ({len(token_ids(PROMPT)):,} emulator tokens); the Hugging Face"
            " tokenizer is a 32k-vocabulary byte-level BPE trained on the standard library's sources (nothing"
            " downloaded).",
            "",
            "| operation | us per call |",
            "|---|---|",
            *[f"| {name.strip()} | {micros:.1f} |" for name, micros in rows],
        ]
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
