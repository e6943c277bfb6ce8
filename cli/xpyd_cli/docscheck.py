"""Checks that what the docs cite exists: repository paths, `make` targets, `xpyd` flags, condition reasons,
and the numbers quoted from bench/results/: those of the READMEs' claim tables, and every measured number
of a paragraph, list item or table row that cites a bench/results file.

Each checker takes a document's text and returns its problems (empty when it is right), so a test can run
it on the committed docs and on a copy with a planted mistake. `tests/repo/test_docs_cite.py` runs them.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

import yaml

from xpyd_cli.docsgen import Field, _code

ROOT: Final = Path(__file__).resolve().parents[2]
RESULTS: Final = ROOT / "bench" / "results"


def cited_docs() -> list[Path]:
    """The documents whose citations are checked."""
    docs = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
    return [d for d in docs if d.exists()]


def _spans(text: str) -> list[str]:
    """Inline code spans and the lines of fenced code blocks: where commands and paths are written."""
    out: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            out.append(line)
        else:
            out += re.findall(r"`([^`\n]+)`", line)
    return out


# --- repository paths --------------------------------------------------------------------------------

LINK: Final = re.compile(r"\]\(([^)\s]+)\)")
_PLACEHOLDER: Final = re.compile(r"[<>{}$]|\.\.\.|\bN\b")


def _top_level(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if not p.name.startswith(".")} - {"build", "dist", "xpyd.egg-info"}


def _exists(root: Path, path: str) -> bool:
    if any(c in path for c in "*?["):
        return any(root.glob(path.rstrip("/")))
    return (root / path).exists()


def missing_paths(text: str, doc: str, root: Path = ROOT) -> list[str]:
    """Repository paths `text` (the document at `doc`, relative to `root`) cites that do not exist: links
    (relative to the document's folder) and code spans naming a path under a top-level folder."""
    top = _top_level(root)
    folder = (root / doc).parent
    out: list[str] = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:|#|mailto:", target):
            continue
        path = target.split("#", 1)[0]
        if path and not (folder / path).exists() and not _exists(folder.resolve(), path):
            out.append(path)
    for span in _spans(text):
        for word in re.split(r"[\s=()\[\],;'\"]+", span.replace("\\|", " ")):
            word = re.sub(r"[:.]+$|:\d+$", "", word.strip())
            first = word.split("/", 1)[0]
            if "/" not in word or first not in top or _PLACEHOLDER.search(word):
                continue
            if not _exists(root, word) and not (folder / word).exists():
                out.append(word)
    return sorted(set(out))


# --- make targets ------------------------------------------------------------------------------------


def make_targets(makefile: str) -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", makefile, flags=re.MULTILINE))


def missing_make_targets(text: str, targets: set[str]) -> list[str]:
    """`make <target>` in code spans whose target the Makefile lacks."""
    found = {m for span in _spans(text) for m in re.findall(r"(?:^|[\s;&|(])make ([a-z][\w-]*)", span)}
    return sorted(found - targets)


# --- xpyd flags --------------------------------------------------------------------------------------

_XPYD: Final = re.compile(r"(?:^|[\s;&|(/$])xpyd ([a-z][\w-]*)((?:\s+[^\s;&|)]+)*)")


def unknown_flags(text: str, parsers: Mapping[str, argparse.ArgumentParser]) -> list[str]:
    """`xpyd <command> [subcommand] --flag` in code spans whose flag (or command) the parsers do not have."""
    out: list[str] = []
    for span in _spans(text):
        line = span.replace("\\|", "|")
        for m in _XPYD.finditer(line):
            if re.search(r"\bhelm (?:install|upgrade|template|uninstall|status)\s*$", line[: m.start(1) - 5]):
                continue  # `helm install xpyd oci://...`: the release, not the command
            command, words = f"xpyd {m[1]}", m[2].split()
            if command not in parsers:
                if not _PLACEHOLDER.search(m[1]):
                    out.append(command)
                continue
            if words and f"{command} {words[0]}" in parsers:
                command = f"{command} {words[0]}"
            known = {s for action in parsers[command]._actions for s in action.option_strings}
            for word in words:
                if word == "--":  # the rest is the engine's command line (xpyd emulate)
                    break
                flag = word.split("=", 1)[0].rstrip(".,:")
                if re.fullmatch(r"--?[A-Za-z][\w-]*", flag) and flag not in known:
                    out.append(f"{command} {flag}")
    return sorted(set(out))


def unknown_table_flags(text: str, section: str, parser: argparse.ArgumentParser) -> list[str]:
    """Flags in the first column of the `| flag | ...` tables under the heading `section` that `parser`
    lacks (docs/configure.md's router tables)."""
    known = {s for action in parser._actions for s in action.option_strings}
    out: list[str] = []
    inside = table = False
    for line in text.splitlines():
        if line.startswith("#"):
            inside = line.lstrip("# ").strip() == section
            table = False
            continue
        if inside and line.lower().startswith("| flag |"):
            table = True
        elif table and line.startswith("|"):
            first = line.split("|")[1]
            out += [f for f in re.findall(r"`(--[\w-]+)", first) if f not in known]
            out += [f for f in re.findall(r"(?:,|^)\s*`(--[\w-]+)", first) if f not in known]
        else:
            table = False
    return sorted(set(out))


# --- condition reasons -------------------------------------------------------------------------------

_STATUS: Final = re.compile(r"`([A-Z]\w+)=(?:True|False|Unknown)`((?:\s*/?\s*\([^)]*\))+|,\s*`[A-Z]\w+`)")


def unknown_reasons(text: str, reasons: Mapping[str, Iterable[str]]) -> list[str]:
    """Condition reasons cited (`reason \\`X\\``, `` `Type=Status` (`X`, `Y`) ``) that the operator never
    gives (that type)."""
    every = {r for rs in reasons.values() for r in rs}
    out = [r for r in re.findall(r"\breasons? `([A-Z]\w+)`", text) if r not in every]
    for m in _STATUS.finditer(text):
        type_ = m[1]
        if type_ not in reasons:
            out.append(f"{type_} (not a condition type)")
            continue
        out += [f"{type_}/{r}" for r in re.findall(r"`([A-Z]\w+)`", m[2]) if r not in reasons[type_]]
    return sorted(set(out))


# --- numbers quoted from bench/results ---------------------------------------------------------------

_UNIT: Final = r"%|ms\b|us\b|µs\b|s\b|x\b|MB\b|MiB\b|GB\b|GiB\b|pt\b|min\b|CPU-us\b|CPU-µs\b|CPU-s\b|CPU-seconds\b"
_NUMBER: Final = re.compile(
    rf"(?<![\w.\-/+])(\d[\d,]*(?:\.\d+)?)(?!\d|\.\d)(?:\s*-\s*(\d[\d,]*(?:\.\d+)?)(?!\d|\.\d))?(?:\s*({_UNIT}))?"
)
_SEQUENCE: Final = re.compile(r"\d(?:[\d.,]*)(?:\s*/\s*\d[\d.,]*)+")


def quoted_numbers(cell: str) -> list[tuple[str, str]]:
    """The measured numbers in a table cell: those with a unit or a percent sign, decimals, the members of
    a range (`34-36%`) and of `a / b / c` lists."""
    cell = re.sub(r"`[^`]*`|\[[^\]]*\]\([^)]*\)", " ", cell)  # commands and links are not quotes
    listed = {n for m in _SEQUENCE.finditer(cell) for n in re.findall(r"\d[\d.,]*", m[0])}
    out: list[tuple[str, str]] = []
    for m in _NUMBER.finditer(cell):
        if not m[3] and re.match(r"[A-Za-z]", cell[m.end() : m.end() + 1]):
            continue  # a name or a setting (`32k`, `2P4D`), not a measurement
        if re.search(r"\bdefault:? $", cell[: m.start()]):
            continue  # a setting's default (`--join-timeout`, default 300 s): docs/reference checks those
        values = [v.rstrip(",") for v in (m[1], m[2]) if v]
        if m[3] or m[2] or any("." in v for v in values) or any(v in listed for v in values):
            out += [(v, m[3] or "") for v in values]
    return out


def _decimals(value: str) -> int:
    return len(value.split(".", 1)[1]) if "." in value else 0


# A quoted unit -> the factors from a results file's figure to it (a result in ms quoted in s, a fraction
# quoted as a percentage).
_FACTORS: Final[dict[str, tuple[float, ...]]] = {
    "%": (1, 100),
    "s": (1, 1e-3),
    "ms": (1, 1e-3, 1e3),
    "us": (1, 1e3),
    "µs": (1, 1e3),
}


def found_in(value: str, texts: Iterable[str], unit: str = "") -> bool:
    """Whether a quoted number appears in the texts, exactly or as a more precise figure that rounds to it,
    in the quoted unit or one `_FACTORS` converts from (96.4% from 0.964, 0.8 s from 828 ms)."""
    wanted = float(value.replace(",", ""))
    places = _decimals(value)
    factors = _FACTORS.get(unit, (1,))
    for text in texts:
        for raw in re.findall(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?", text):
            number = float(raw.replace(",", ""))
            for factor in factors:
                precise = _decimals(raw) >= places or factor != 1
                if precise and round(number * factor, places) == round(wanted, places):
                    return True
    return False


def results_texts(names: Iterable[str] = ()) -> dict[str, str]:
    """bench/results files by name: those named, or all of them."""
    files = [RESULTS / n for n in names] if names else sorted(RESULTS.glob("*.md")) + sorted(RESULTS.glob("*.json"))
    return {f.name: f.read_text(encoding="utf-8") for f in files if f.exists()}


def table_rows(text: str, heading: str) -> list[list[str]]:
    """The body rows of the first table under a heading (cells stripped)."""
    rows: list[list[str]] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("#"):
            if rows:
                break
            inside = heading in line
            continue
        if inside and line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            if not all(set(c) <= set("-: ") for c in cells):
                rows.append(cells)
        elif rows:
            break
    return rows[1:]


def row_results(row: Sequence[str], results: Mapping[str, str]) -> list[str]:
    """The results files a row names: its links into bench/results, and those whose text names a
    benchmark script the row cites (each results file says which command wrote it)."""
    joined = " ".join(row)
    named = {Path(t).name for t in re.findall(r"results/([\w.-]+\.(?:md|json))", joined)}
    scripts = set(re.findall(r"bench/[\w/-]+\.py", joined))
    return sorted(n for n, t in results.items() if n in named or any(s in t for s in scripts))


def unquoted_numbers(rows: Sequence[Sequence[str]], column: int, results: Mapping[str, str]) -> list[str]:
    """`claim: number` for each number of `rows[i][column]` that the row's own results files (row_results)
    do not hold; a row that names none is looked up in every results file."""
    out: list[str] = []
    for row in rows:
        own = [results[n] for n in row_results(row, results)] or list(results.values())
        for value, unit in quoted_numbers(row[column]):
            if not found_in(value, own, unit):
                out.append(f"{row[0][:60]}: {value}{unit}")
    return out


_CITE: Final = re.compile(r"(?<![\w-])results/([\w.-]+)")
_ITEM: Final = re.compile(r"\s*(?:[-*+]|\d+\.)\s")


def blocks(text: str) -> list[str]:
    """A Markdown text's paragraphs, list items and table rows; headings, table rules and fenced code left
    out."""
    out: list[str] = []
    lines: list[str] = []
    fenced = False
    for line in [*text.splitlines(), ""]:
        if fenced or line.lstrip().startswith("```") or line.startswith(("|", "#")) or not line.strip():
            out += ["\n".join(lines)] if lines else []
            lines = []
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif line.startswith("|") and not fenced and not set(line) <= set("|-: "):
                out.append(line)
            continue
        if _ITEM.match(line) and lines:
            out.append("\n".join(lines))
            lines = []
        lines.append(line)
    return out


def cited_results(block: str, names: Iterable[str] = ()) -> list[str]:
    """The bench/results files a block cites: paths and links into bench/results and, once it cites one,
    the bare names of other results files (`bench/results/deepseek.md and deepseek-sim.md`) among `names`
    and the files in bench/results."""
    cited = set(_CITE.findall(block))
    if not cited:
        return []
    known = set(names) | {p.name for p in RESULTS.iterdir()}
    cited |= {n for n in re.findall(r"(?<![\w/.-])([\w-]+\.(?:md|json|png))\b", block) if n in known}
    return sorted(cited)


def unquoted_cited_numbers(text: str, results: Mapping[str, str]) -> list[str]:
    """`block: number` for each measured number (quoted_numbers) of a paragraph, list item or table row
    (blocks) that cites bench/results files (cited_results) and that those files, and the results files of
    the benchmark scripts it names (each says which command wrote it), do not hold. A block citing only
    images is looked up in every results file."""
    out: list[str] = []
    for block in blocks(text):
        cited = cited_results(block, results)
        if not cited:
            continue
        scripts = set(re.findall(r"bench/[\w/-]+\.py", block))
        cited += [n for n, t in results.items() if n not in cited and any(s in t for s in scripts)]
        own = [results[n] for n in cited if n in results] or list(results.values())
        start = " ".join(re.sub(r"[*`|#]", " ", block).split())[:50]
        for value, unit in quoted_numbers(block):
            if not found_in(value, own, unit):
                out.append(f"{start}: {value}{unit}")
    return out


# --- benchmarks `make bench` runs --------------------------------------------------------------------


def benchmarks_not_run(cited: Iterable[str], runner: str) -> list[str]:
    """The benchmark scripts (`bench/.../*.py`) in `cited` texts that bench/run-all.sh does not run."""
    scripts = {s for text in cited for s in re.findall(r"bench/[\w/-]+\.py", text)}
    return sorted(s for s in scripts if not re.search(rf"^\$PY {re.escape(s)}\b", runner, flags=re.MULTILINE))


# --- configure.md's hand-written defaults ------------------------------------------------------------


def _literal(cell: str) -> tuple[bool, object]:
    """(True, value) for a cell that is one code span holding a YAML literal (`2`, `{}`, `kv-aware`); a
    span of prose (`max(60, 4 x intervalSeconds)`) is not one."""
    m = re.fullmatch(r"`([^`]*)`", cell.strip())
    if not m:
        return False, None
    try:
        value = yaml.safe_load(m[1])
    except yaml.YAMLError:
        return False, None
    if value is None and m[1] not in ("null", "~"):
        return (True, "") if m[1] == '""' else (False, None)
    if isinstance(value, str) and " " in value:
        return False, None
    return True, value


def default_mismatches(text: str, fields: Iterable[Field]) -> list[str]:
    """Rows `| \\`path\\` | default | ... |` of docs/configure.md whose default, one literal in a code span,
    is not the schema's default for that field (or the schema has none and its description names none)."""
    by_path = {f.path: f for f in fields}
    out: list[str] = []
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) < 3 or not (m := re.fullmatch(r"`(spec\.[^`]+)`", cells[0])):
            continue
        field = by_path.get(m[1])
        literal, value = _literal(cells[1])
        if field is None or not literal:
            continue
        if field.has_default:
            if value != field.schema_default:
                out.append(f"{field.path}: docs say {cells[1]}, the model {_code(field.schema_default)}")
        elif not re.search(rf"(?:default:? |; ){re.escape(str(value))}(?:\b|$)", field.description):
            out.append(f"{field.path}: docs say {cells[1]}, the model has no default")
    return out
