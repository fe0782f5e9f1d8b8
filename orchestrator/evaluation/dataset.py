"""Datasets: the tickets an evaluation runs, and what a good answer to each is.

A dataset is a folder:

    datasets/demo/
      tickets/              the tickets, in any format inbox/ takes (.txt, .md, .json, .eml)
      expectations.yaml     per ticket id: category, contains, not_contains, reference,
                            outcome (pass | needs_person); every key optional

or a label export (`ticketgraph labels export`, JSON lines with run, ticket, category, draft,
verdict, final, ...): each labelled ticket is run again from the file its run claimed
(runs/<run>/claimed/), expecting the person's category, their final text as the reference,
and `pass` where they sent the draft as it was (sent, audit_good), `needs_person` otherwise
(edited, closed, audit_bad). Agreement with the labels is that outcome, met or not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.config.workspace import Workspace
from orchestrator.errors import UsageError

TICKETS = "tickets"
EXPECTATIONS = ("expectations.yaml", "expectations.yml", "expectations.json")
# A person's verdict on a draft, and the outcome it asks of the run (the draft was good as
# it was, or it needed a person).
GOOD_VERDICTS = {"sent", "audit_good"}
LABEL_VERDICTS = GOOD_VERDICTS | {"edited", "closed", "audit_bad"}

Outcome = Literal["pass", "needs_person"]


class Expectation(BaseModel):
    """What a good answer to one ticket is; whatever is left out is not checked."""

    model_config = ConfigDict(extra="forbid")

    category: str | None = None
    contains: list[str] = Field(default_factory=list)
    not_contains: list[str] = Field(default_factory=list)
    reference: str | None = None
    outcome: Outcome | None = None
    label: str | None = None  # the person's verdict, for a dataset made of labels


class Label(BaseModel):
    """One line of a label export (the fields an evaluation reads; the rest are kept out)."""

    model_config = ConfigDict(extra="ignore")

    run: str
    ticket: str
    category: str | None = None
    verdict: str
    final: str | None = None


@dataclass
class Dataset:
    """Ticket files by id, and the expectation of each."""

    source: Path
    tickets: dict[str, Path] = field(default_factory=dict)
    expected: dict[str, Expectation] = field(default_factory=dict)


def load(source: Path, workspace: Workspace) -> Dataset:
    """The dataset at `source` (a folder, or a label export read against `workspace`'s
    runs); `UsageError` saying what is missing or malformed."""
    if source.is_dir():
        return _folder(source)
    if source.is_file() and source.suffix in (".jsonl", ".ndjson"):
        return _labels(source, workspace)
    raise UsageError(
        f"{source}: not a dataset: give a folder with {TICKETS}/ and expectations.yaml, "
        "or a label export (.jsonl)"
    )


def _folder(root: Path) -> Dataset:
    folder = root / TICKETS
    if not folder.is_dir():
        raise UsageError(f"{root}: a dataset folder needs {TICKETS}/ with the tickets in it")
    dataset = Dataset(root)
    for path in sorted(folder.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            dataset.tickets[path.stem] = path
    found = [root / name for name in EXPECTATIONS if (root / name).is_file()]
    raw = _read_mapping(found[0]) if found else {}
    for ticket, value in raw.items():
        try:
            dataset.expected[str(ticket)] = Expectation.model_validate(value or {})
        except ValidationError as exc:
            problem = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise UsageError(f"{found[0]}: {ticket}: {problem}") from exc
    if unknown := sorted(set(dataset.expected) - set(dataset.tickets)):
        raise UsageError(f"{found[0]}: no file in {folder} for {', '.join(unknown)}")
    return dataset


def _read_mapping(path: Path) -> dict[str, object]:
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: cannot read the expectations: {exc}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: the expectations are a mapping of ticket id to what is expected")
    return data


def _labels(path: Path, workspace: Workspace) -> Dataset:
    dataset = Dataset(path)
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            label = Label.model_validate_json(line)
        except ValidationError as exc:
            raise UsageError(
                f"{path}:{number}: not a label line: {exc.errors()[0]['msg']}"
            ) from exc
        if label.verdict not in LABEL_VERDICTS:
            raise UsageError(f"{path}:{number}: unknown verdict {label.verdict!r}")
        claimed = sorted((workspace.runs / label.run / "claimed").glob(f"{label.ticket}.*"))
        if not claimed:
            raise UsageError(
                f"{path}:{number}: the ticket file of {label.ticket} is not in "
                f"runs/{label.run}/claimed/ of {workspace.root} (cleaned up?)"
            )
        dataset.tickets[label.ticket] = claimed[0]
        dataset.expected[label.ticket] = Expectation(
            category=label.category,
            reference=label.final,
            outcome="pass" if label.verdict in GOOD_VERDICTS else "needs_person",
            label=label.verdict,
        )
    if not dataset.tickets:
        raise UsageError(f"{path}: no labels in it")
    return dataset
