"""README.md stays true: its sample output is what a real run prints, and its many-machines
section runs as written."""

from __future__ import annotations

import re
from pathlib import Path

from tests.orchestrator.conftest import Cli

README = Path(__file__).resolve().parents[2] / "README.md"
SAMPLE_COMMAND = "    $ ticketgraph run      # output of a real run"


def indented_block(after: str) -> list[str]:
    """The README's indented code lines after the line starting with `after` (blank lines
    inside the block kept), without their indent."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(after)) + 1
    block: list[str] = []
    for line in lines[start:]:
        if line and not line.startswith("    "):
            break
        block.append(line[4:])
    while block and not block[-1]:
        block.pop()
    return block


def normalised(lines: list[str]) -> list[str]:
    """Lines with what differs between runs (times, run ids) replaced."""
    out = []
    for line in lines:
        line = re.sub(r"run-\d{8}-\d{6}-[0-9a-f]{4}", "RUN_ID", line)
        line = re.sub(r"\b\d+ms\b", "Nms", line)
        out.append(re.sub(r"\s+$", "", line))
    return out


def test_the_readme_sample_output_is_what_the_demo_prints(demo: Path, cli: Cli) -> None:
    done = cli("run", cwd=demo)
    assert done.returncode == 1, done.stderr
    shown = normalised(indented_block(SAMPLE_COMMAND))
    printed = normalised(done.stdout.splitlines())
    # Column widths of the time column move with the digits: compare words, not spaces.
    assert [line.split() for line in printed] == [line.split() for line in shown]
