"""The `xpyd operator` command line and the resync hook registry."""

from __future__ import annotations

import pytest

from xpyd_operator import cli, hooks


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--namespace", "a", "--all-namespaces"], "either --namespace or --all-namespaces"),
        (["--resync-seconds", "0"], "--resync-seconds must be > 0"),
    ],
)
def test_bad_arguments_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().out


async def test_a_failing_hook_does_not_stop_the_others() -> None:
    seen: list[int] = []

    async def broken(ctx: hooks.ResyncContext) -> None:
        raise RuntimeError("boom")

    async def counting(ctx: hooks.ResyncContext) -> None:
        seen.append(len(ctx.objects))

    before = hooks.registered()
    hooks.on_resync(broken)
    hooks.on_resync(counting)
    try:
        await hooks.run_all(hooks.ResyncContext(client=None, objects=[{}, {}], interval=1.0))  # type: ignore[arg-type]
    finally:
        hooks._HOOKS[:] = before
    assert seen == [2]


def test_load_plugins_skips_missing_modules() -> None:
    assert hooks.load_plugins(("xpyd_operator.no_such_plugin",)) == []
