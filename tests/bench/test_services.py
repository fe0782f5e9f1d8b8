"""The soaks' folders: a rerun never hands its trials the last run's workspaces."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench import soak
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
