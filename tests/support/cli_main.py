"""``run_main``: the ``autotune`` entry point run in-process, for tests of whole commands."""

from __future__ import annotations

import pytest

from autotune import cli


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``autotune ARGS``; a clean exit (None) is 0."""
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    out, err = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), out, err
