"""A workspace's scripted replies for its own tickets: what `ticketgraph scenarios init`
writes into the workspace's scenario file (scenarios/demo.yaml), so a team's tickets run
offline before any model is set up.

For the tickets in inbox/ that the file does not answer yet, it adds a line
`<id>: CATEGORY` to the router's reply and a script per ticket whose reply is `REPLY`, for
the team to fill in. The router's reply is one script answering every ticket: the scripted
provider picks one script per request, and routing reads only the lines of the tickets it
asked about, so the same reply serves a run of all of them or of any part. A file that
exists keeps its text: the router's script is re-rendered with the new lines added, and the
new scripts are appended.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from orchestrator.config import layers
from orchestrator.config.workspace import DEMO_SCENARIOS, Workspace
from orchestrator.errors import ConfigError, UsageError
from orchestrator.intake import inbox
from orchestrator.run.records import RunConfig
from orchestrator.steps import agent, prompts, routing
from workers.errors import ScenarioError
from workers.provider.request import ChatRequest, ConversationView
from workers.provider.scenario import Scenario, Script, load_scenario

CATEGORY = routing.TO_FILL  # the router's line for a ticket, until someone picks its category
REPLY = "REPLY"  # a ticket's reply, until someone writes it
SHOWN_CHARS = 160  # of a ticket's text in the comment above its script
ROUTER_MARK = "ticket router"  # in the built-in routing prompt: what the router's `when` finds


@dataclass(frozen=True)
class Added:
    """What `add_for_inbox` wrote: into which file, for which tickets."""

    path: Path
    created: bool
    routed: list[str]  # tickets given a line in the router's reply
    scripted: list[str]  # tickets given a script of their own
    categories: list[str]

    def said(self) -> str:
        """What was added, and what to do next, in a few lines."""
        where = os.path.relpath(self.path)
        if not self.routed and not self.scripted:
            return f"{where} already answers every ticket in inbox/: nothing added\n"
        what = []
        if self.routed:
            what.append(f"the router's reply names {_listed(self.routed)}")
        if self.scripted:
            what.append(f"a script of its own for {_listed(self.scripted)}")
        verb = "written" if self.created else "added to"
        return (
            f"{where} {verb}: {'; '.join(what)}\n"
            f"next: in {where}, replace each {CATEGORY} with one of "
            f"{', '.join(self.categories)} and each {REPLY} with the ticket's reply; "
            "then `ticketgraph run`\n"
        )


def _listed(ids: list[str]) -> str:
    """`C-1` or `3 tickets (C-1, C-2, C-3)`, shortened past a few."""
    if len(ids) == 1:
        return ids[0]
    shown = ", ".join(ids) if len(ids) <= 5 else f"{ids[0]}, {ids[1]} … {ids[-1]}"
    return f"{len(ids)} tickets ({shown})"


def add_for_inbox(workspace: Workspace) -> Added:
    """Add to the workspace's scenario file what its inbox's tickets need to run offline;
    `UsageError` if inbox/ holds no ticket, `ConfigError` if the file cannot be read or
    would not load once written."""
    config = layers.declared(workspace)
    tickets = inbox_tickets(workspace)
    path = workspace.scenarios
    scenario = _loaded(path)
    router = _router_script(scenario, config, tickets)
    named = _named(router, tickets, config)
    routed = [t for t in tickets if t.id not in named]
    # A ticket the router sends to a template (or to other) needs no reply of its own.
    drafted = [t for t in tickets if t.id not in named or named[t.id] in config.workers]
    scripted = [t for t in drafted if not _answered(scenario, router, t)]
    if routed or scripted:
        old = path.read_text(encoding="utf-8") if scenario is not None else None
        _write_checked(path, _new_text(old, scenario, router, config, routed, scripted))
    ids = [t.id for t in routed], [t.id for t in scripted]
    return Added(path, scenario is None, *ids, config.categories)


def inbox_tickets(workspace: Workspace) -> list[inbox.Ticket]:
    """The tickets in inbox/ as a run would read them (files that are not tickets, and
    dotfiles still being written, left out); nothing is moved. `UsageError` if none."""
    rules = inbox.InboxRules(**workspace.config().inbox.model_dump())
    # Every file counts however fresh: this reads, it claims nothing.
    names = inbox.claimable(workspace.inbox, float("inf"), rules)
    seen = [inbox.inspect(workspace.inbox / name, rules) for name in names]
    tickets, _duplicates = inbox.dedupe([t for t in seen if isinstance(t, inbox.Ticket)])
    if not tickets:
        raise UsageError(
            f"{workspace.inbox} holds no ticket to script: drop your tickets there first "
            "(.txt, .md, .json or .eml)"
        )
    return tickets


def _loaded(path: Path) -> Scenario | None:
    """The scenario file as it is, or None if there is none yet."""
    if not path.exists():
        return None
    try:
        return load_scenario(path)
    except ScenarioError as exc:
        raise ConfigError(f"{exc} (fix it, then run `ticketgraph scenarios init` again)") from exc


def _router_system(config: RunConfig) -> str:
    """The routing prompt the workspace's router is sent."""
    categories = agent.categories_text(config)
    own = agent.role_of(config, "router").prompt
    return (own or prompts.ROUTER).replace("{categories}", categories)


def _view(system: str, user: str) -> ConversationView:
    """What a script's `when` sees of a request with this system prompt and user text."""
    request = ChatRequest(
        model="scripted",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
    )
    return ConversationView.of(request)


def _router_script(
    scenario: Scenario | None, config: RunConfig, tickets: list[inbox.Ticket]
) -> Script | None:
    """The script that answers the router about these tickets, if any."""
    if scenario is None:
        return None
    text = [(t.id, inbox.route_text(t.text, config.route_chars)) for t in tickets]
    found = scenario.match(_view(_router_system(config), prompts.router_input(text)))
    return found.script if found is not None else None


def _named(router: Script | None, tickets: list[inbox.Ticket], config: RunConfig) -> dict[str, str]:
    """The tickets the router's first reply names, and the category each gets."""
    if router is None or router.replies[0].text is None:
        return {}
    decided = routing.parse(router.replies[0].text, [t.id for t in tickets], config.categories)
    return {i: d.category for i, d in decided.decisions.items() if d.category is not None}


def _answered(scenario: Scenario | None, router: Script | None, ticket: inbox.Ticket) -> bool:
    """True if a script other than the router's answers the ticket's draft request."""
    if scenario is None:
        return False
    found = scenario.match(_view("", prompts.draft_input(ticket.id, ticket.text)))
    return found is not None and found.script is not router


# --- the text written ----------------------------------------------------------------------


def _new_text(
    old: str | None,
    scenario: Scenario | None,
    router: Script | None,
    config: RunConfig,
    routed: list[inbox.Ticket],
    scripted: list[inbox.Ticket],
) -> str:
    """The file's new text: the old one with the router's script re-rendered (if it gains
    lines) and the new scripts appended; or a new file."""
    lines = [f"{t.id}: {CATEGORY}" for t in routed]
    if old is None or scenario is None:
        head = _header(config)
        router_text = _router_yaml(None, lines, config) if lines else ""
        return "\n".join(p for p in (head, router_text, *_ticket_scripts(scripted)) if p)
    text = old if old.endswith("\n") else old + "\n"
    if lines:
        if router is None:  # no router script yet: it goes first, where it is tried first
            text = _router_yaml(None, lines, config) + "\n" + text
        else:
            text = _replace_item(text, scenario.scripts.index(router), router, lines, config)
    added = _ticket_scripts(scripted)
    return text + ("\n" + "\n".join(added) if added else "")


def _header(config: RunConfig) -> str:
    """The comment at the top of a new file: what to fill in, and how."""
    categories = ", ".join(config.categories)
    return (
        f"# Scripted replies for this workspace's own tickets: `ticketgraph run` serves them\n"
        "# when LLM_BASE_URL is not set. Written by `ticketgraph scenarios init`; run it again\n"
        "# when new tickets arrive in inbox/: it adds theirs and keeps what you wrote here.\n"
        "#\n"
        f"# 1. In the router's reply, replace each {CATEGORY} with the ticket's category, one\n"
        f"#    of: {categories} (any other word routes the ticket to other).\n"
        f"# 2. In each ticket's script, replace {REPLY} with the reply its worker should give\n"
        "#    (the gate checks it names the ticket id). A worker may call a tool first:\n"
        "#      replies:\n"
        "#        - tool_calls: [{id: c1, name: order_status, arguments: {order_id: O-1001}}]\n"
        "#        - text: Ticket ...: the reply, written knowing what the tool said.\n"
        "# Every key of a script: `ticketgraph provider --help`.\n"
    )


def _router_yaml(router: Script | None, lines: list[str], config: RunConfig) -> str:
    """The router's script with `lines` added to its first reply (a new one if None)."""
    if router is None:
        system = _router_system(config)
        mark = ROUTER_MARK if ROUTER_MARK in system else re.escape(system.splitlines()[0][:60])
        data: dict[str, object] = {"name": "router", "when": {"system": mark}}
        replies: list[dict[str, object]] = [{"text": "\n".join(lines)}]
    else:
        data = _whole(router.model_dump(exclude_defaults=True, exclude={"replies"}))
        replies = [r.model_dump(exclude_none=True) for r in router.replies]
        first = str(replies[0].get("text") or "").rstrip("\n")
        replies[0]["text"] = "\n".join([first, *lines] if first else lines)
    data["replies"] = replies
    return _dumped([data])


def _whole(data: dict[str, object]) -> dict[str, object]:
    """`data` with whole floats written as integers (`latency_ms: 60`, as people write it)."""
    return {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in data.items()}


def _ticket_scripts(tickets: Iterable[inbox.Ticket]) -> list[str]:
    """A script per ticket, answering its draft and any rewrite, with its text above it."""
    out = []
    for t in tickets:
        said = " ".join(t.text.split())
        said = said if len(said) <= SHOWN_CHARS else said[: SHOWN_CHARS - 1] + "…"
        ticket_id = t.id.replace(".", r"\.")
        script = {
            "name": t.id,
            "when": {"user": f"^(Ticket id: |Your previous draft for ticket ){ticket_id}[:\\n]"},
            "replies": [{"text": f"Ticket {t.id}: {REPLY}"}],
        }
        out.append(f"# {t.id} ({t.name}): {said}\n" + _dumped([script]))
    return out


def _dumped(data: object) -> str:
    """YAML as a person would write it: keys in order, long texts as literal blocks."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes a text with line breaks as a `|-` block."""


def _text_block(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _text_block)


def _replace_item(
    text: str, index: int, router: Script, lines: list[str], config: RunConfig
) -> str:
    """`text` with its `index`-th top-level script replaced by the router's, lines added.
    The scripts of a scenario file are a block list at column 0 (`- name: ...`); comments
    and blank lines between two scripts stay where they are."""
    items = _items(text.splitlines(keepends=True))
    if len(items) <= index:
        raise ConfigError(
            f"{DEMO_SCENARIOS} is not a list of scripts starting each at the line's start "
            f"(`- name: ...`): add these lines to its router's reply by hand: {'; '.join(lines)}"
        )
    start, end = items[index]
    all_lines = text.splitlines(keepends=True)
    new = _router_yaml(router, lines, config)
    return "".join(all_lines[:start]) + new + "".join(all_lines[end:])


def _items(lines: list[str]) -> list[tuple[int, int]]:
    """(first, past last) line of each top-level `- ` item; comments and blank lines after
    an item's last indented line are not part of it."""
    items: list[tuple[int, int]] = []
    start: int | None = None
    last = 0
    for number, line in enumerate(lines):
        if line.startswith("- ") or line.rstrip("\n") == "-":
            if start is not None:
                items.append((start, last + 1))
            start, last = number, number
        elif start is not None and line.strip() and not line.lstrip().startswith("#"):
            if not line[0].isspace():
                break  # not a block list at column 0: the caller says so
            last = number
    if start is not None:
        items.append((start, last + 1))
    return items


def _write_checked(path: Path, text: str) -> None:
    """Write `text` to `path` only if it loads as a scenario, in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".yaml")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        load_scenario(temp)
        os.replace(temp, path)
    except ScenarioError as exc:
        raise ConfigError(f"{path}: the scripts added would not load ({exc})") from exc
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
