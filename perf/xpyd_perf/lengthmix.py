"""Prompt/output length mixes read from trace text (Mooncake JSONL or Azure CSV), without I/O."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass


class TraceFormatError(ValueError):
    """Trace text that is neither Mooncake JSONL nor Azure CSV; the message says which line."""


@dataclass(frozen=True, slots=True)
class LengthMix:
    """Prompt and output lengths of a trace, one pair per request."""

    prompts: tuple[int, ...]
    outputs: tuple[int, ...]

    def percentile(self, q: float) -> int:
        """The prompt length at quantile q in [0, 1] (nearest rank)."""
        ordered = sorted(self.prompts)
        index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
        return ordered[index]

    @property
    def mean_prompt(self) -> int:
        return round(sum(self.prompts) / len(self.prompts))

    @property
    def mean_output(self) -> int:
        return max(1, round(sum(self.outputs) / len(self.outputs)))


def parse_lengths(lines: Iterable[str]) -> LengthMix:
    """Parse trace lines: JSON objects with input_length/output_length, or a CSV with
    ContextTokens/GeneratedTokens columns. Raises TraceFormatError naming the bad line."""
    rows = [line for line in lines if line.strip()]
    if not rows:
        raise TraceFormatError("trace is empty")
    prompts: list[int] = []
    outputs: list[int] = []
    if rows[0].lstrip().startswith("{"):
        for number, line in enumerate(rows, 1):
            try:
                item = json.loads(line)
                prompts.append(int(item["input_length"]))
                outputs.append(int(item["output_length"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise TraceFormatError(f"trace line {number}: need input_length and output_length ({exc})") from exc
    else:
        reader = csv.DictReader(rows)
        fields = set(reader.fieldnames or [])
        if not {"ContextTokens", "GeneratedTokens"} <= fields:
            raise TraceFormatError(f"CSV trace needs ContextTokens and GeneratedTokens columns, got {sorted(fields)}")
        for number, rec in enumerate(reader, 2):
            try:
                prompts.append(int(rec["ContextTokens"]))
                outputs.append(int(rec["GeneratedTokens"]))
            except (ValueError, TypeError) as exc:
                raise TraceFormatError(f"trace line {number}: {exc}") from exc
    pairs = [(p, o) for p, o in zip(prompts, outputs, strict=True) if p > 0]
    if not pairs:
        raise TraceFormatError("trace has no request with a positive prompt length")
    return LengthMix(tuple(p for p, _ in pairs), tuple(max(1, o) for _, o in pairs))
