"""Command-line validation of `xpyd router`: clear errors, exit code 2."""

from __future__ import annotations

import pytest

from xpyd_router.cli import main

U = "http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give either --deployment"),
        (["--deployment", "d", "--decode", U], "give either --deployment"),
        (["--worker", U, "--decode", U], "cannot be mixed"),
        (["--prefill", U], "needs at least one --decode"),
        (["--decode", U, "--port", "0"], "--port must be"),
        (["--decode", U, "--block-chars", "100"], "multiple of 8"),
        (["--decode", U, "--max-attempts", "0"], "--max-attempts"),
        (["--decode", "localhost:1"], "worker URL must look like"),
    ],
)
def test_bad_flags(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_unknown_policy_rejected_by_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--decode", U, "--policy", "magic"])
    assert "invalid choice" in capsys.readouterr().err
