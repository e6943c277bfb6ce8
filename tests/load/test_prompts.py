"""Prompt text for replayed traces: shared blocks give shared text, lengths follow the trace."""

from __future__ import annotations

import pytest

from xpyd_load.prompts import CHARS_PER_TOKEN, block_text, prompt_text
from xpyd_sim.trace import TraceRequest


def req(blocks: tuple[int, ...], tokens: int, arrival: float = 0.0) -> TraceRequest:
    return TraceRequest(arrival=arrival, prompt_tokens=tokens, output_tokens=8, blocks=blocks)


def test_block_text_is_deterministic_and_distinct() -> None:
    assert block_text(7) == block_text(7)
    assert block_text(7) != block_text(8)
    assert len(block_text(7)) == 512 * CHARS_PER_TOKEN


@pytest.mark.parametrize(("tokens", "scale"), [(100, 1.0), (1024, 1.0), (1500, 0.5), (3000, 1.0)])
def test_prompt_length_follows_the_trace(tokens: int, scale: float) -> None:
    text = prompt_text(req((1, 2, 3), tokens), scale)
    assert len(text) == int(tokens * scale) * CHARS_PER_TOKEN


def test_shared_prefix_blocks_become_identical_text() -> None:
    a = prompt_text(req((10, 11, 12), 1536))
    b = prompt_text(req((10, 11, 99), 1536))
    shared = 2 * 512 * CHARS_PER_TOKEN
    assert a[:shared] == b[:shared]
    assert a[shared:] != b[shared:]
