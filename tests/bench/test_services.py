"""The soaks' folders: a rerun never hands its trials the last run's workspaces."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import services, soak
from bench.services import trials_folder


def test_a_soak_refuses_a_used_folder_and_gets_a_new_one_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    used = tmp_path / "used"
    (used / "t00" / "demo").mkdir(parents=True)
    with pytest.raises(SystemExit) as stopped:
        soak.main(["--trials", "0", "--folder", str(used)])
    assert stopped.value.code == 2
    assert "is not empty" in capsys.readouterr().err

    parser = argparse.ArgumentParser()
    first, second = trials_folder(parser, None, "soak"), trials_folder(parser, None, "soak")
    try:
        assert first != second and not any(first.iterdir()) and not any(second.iterdir())
        assert trials_folder(parser, tmp_path / "absent", "soak") == tmp_path / "absent"
    finally:
        first.rmdir()
        second.rmdir()


def test_the_bench_compiles_the_checkout_even_where_bytecode_is_not_written() -> None:
    # Where PYTHONDONTWRITEBYTECODE is set, every measured `ticketgraph` process would
    # compile the checkout's modules from source; the bench compiles them once first.
    module = Path(services.REPO, "orchestrator", "exit_codes.py")
    cached = Path(importlib.util.cache_from_source(str(module)))
    cached.unlink(missing_ok=True)
    code = "from bench import services; raise SystemExit(0 if services.precompile() else 1)"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    subprocess.run([sys.executable, "-c", code], cwd=services.REPO, env=env, check=True)
    assert cached.stat().st_mtime_ns >= module.stat().st_mtime_ns
