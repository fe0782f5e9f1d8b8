"""Scenario files for the scripted provider: their models, loading, matching and placeholders.

A scenario file (YAML or JSON) is a top-level list of scripts. The first script in file order
whose `when` matches a request answers it; the reply is picked by the request's turn index,
which is the number of assistant messages in the request (the provider keeps no conversation
state).

    - name: plan                      # required, unique within the file
      when: {model: "^plan$"}         # optional regexes (re.search), all given must match:
                                      #   model, system, user, transcript, tool_results
      latency_ms: 0                   # scripted model time, slept asynchronously
      after_last: error               # or repeat_last, once the turns run past `replies`
      faults: [{turn: 0, status: 429, retry_after: 1, times: 1}]   # also: malformed: true,
                                      #   reset: true, hang_ms: 500, status: 502 + html: true
      replies:
        - tool_calls: [{id: c1, name: list_files, arguments: {}}]
        - text: "done"
          usage: {prompt_tokens: 100, completion_tokens: 5}   # fixed; else counted

Placeholders: a reply's `text`, its tool-call ids and every string inside its `arguments` may
use `{name}` for a named group its `when` regexes capture:

    - name: ticket
      when: {user: '^Ticket id: (?P<ticket>\\S+)'}
      replies:
        - tool_calls: [{id: "c{turn}", name: lookup_ticket, arguments: {id: "{ticket}"}}]
        - text: "Ticket {ticket}: resolved."     # "{ticket}" is "T-7" for "Ticket id: T-7"

Only `{name}` forms that name a group are replaced, so other braces (JSON, say) stay as they
are; a `{name}` that no `when` regex of the script defines is a load-time error. `{turn}` in
an id is the turn index, as before. When two regexes capture the same name, the first in the
order model, system, user, transcript, tool_results wins; a group that took no part in the
match (`(?P<x>a)?`) leaves its placeholder as written. Values go into a string `arguments`
as they are (not JSON-escaped); in a mapping they are JSON-escaped when it is dumped.
Counted usage counts the rendered reply; fixed usage is sent as scripted.

A reply may instead answer line by line (what a router asked about a batch of tickets says):
`lines` are rules tried in order on each line of the request's first user message; the
first rule whose `match` regex is found in a line adds its `text` to the reply, filled from
that regex's named groups (and the `when` groups); a line no rule matches adds nothing, and
`max_lines` stops the reply after that many lines (a model that tires on a long list):

    - name: router
      when: {system: "ticket router"}
      replies:
        - lines:
            - {match: '^(?P<ticket>T-\\d+): .*charged twice', text: "{ticket}: billing"}
            - {match: '^(?P<ticket>T-\\d+): ', text: "{ticket}: other"}
          max_lines: 50

A text reply longer than the request's `max_tokens` (or `max_completion_tokens`) is cut at
that many o200k_base tokens and sent with `finish_reason: length`, as a real model's is.

Matching cost: the regexes are compiled once at load. A script whose `model` regex is an exact
literal (`^name$` with no regex metacharacters between) is indexed by that name, so a request
only tries the scripts indexed under its model and the scripts without such a literal, still
in file order: with many per-model scripts, a request costs about the same as with a few.

What a script is matched against is in `request.py`, the reply it renders in `wire.py`.
This module is plain code over plain data: no HTTP lives here.
"""

from __future__ import annotations

import heapq
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from workers.errors import ScenarioError

if TYPE_CHECKING:
    from workers.provider.request import ConversationView

BUILTIN_PACKAGE = "workers.provider"
BUILTIN_FOLDER = "scenarios"

WHEN_KEYS = ("model", "system", "user", "transcript", "tool_results")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# A `model` regex is an exact literal when no character between `^` and `$` means anything
# to `re` (a newline is left out too: `$` also matches before a trailing one).
_REGEX_SPECIAL = frozenset(".^$*+?{}[]\\|()\n")
# libyaml's loader where PyYAML was built with it: 4x faster on a 10,000-script file.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# --- the scenario file ---------------------------------------------------------------------


class _Strict(BaseModel):
    """Base of the scenario models: a misspelt key is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolCallSpec(_Strict):
    """One scripted tool call; `{turn}` in the id becomes the request's turn index."""

    id: str
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class FixedUsage(_Strict):
    """Usage numbers a reply reports instead of counted ones."""

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)


class LineRule(_Strict):
    """One rule of a line-by-line reply: a line of the request it answers, and the line of
    reply it adds (filled from `match`'s named groups)."""

    match: str
    text: str

    @model_validator(mode="after")
    def _compiles(self) -> LineRule:
        _ = self.pattern
        return self

    @cached_property
    def pattern(self) -> re.Pattern[str]:
        """`match`, compiled once."""
        try:
            return re.compile(self.match)
        except re.error as exc:
            raise ValueError(f"match: regex {self.match!r} does not compile: {exc}") from exc


class Reply(_Strict):
    """One scripted assistant reply: text, tool calls, or text made line by line."""

    text: str | None = None
    tool_calls: list[ToolCallSpec] | None = Field(default=None, min_length=1)
    lines: list[LineRule] | None = Field(default=None, min_length=1)
    max_lines: int | None = Field(default=None, ge=1)
    usage: FixedUsage | None = None

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> Reply:
        if sum(kind is not None for kind in (self.text, self.tool_calls, self.lines)) != 1:
            raise ValueError("a reply needs exactly one of `text`, `tool_calls` or `lines`")
        if self.max_lines is not None and self.lines is None:
            raise ValueError("`max_lines` only goes with `lines`")
        return self

    def answer_lines(self, request_text: str, groups: Mapping[str, str]) -> str:
        """The text of a `lines` reply to a request whose first user message is
        `request_text`: a line per line of it that a rule matches, up to `max_lines`."""
        out: list[str] = []
        for line in request_text.splitlines():
            if self.max_lines is not None and len(out) >= self.max_lines:
                break
            for rule in self.lines or []:
                if (found := rule.pattern.search(line)) is not None:
                    captured = {k: v for k, v in found.groupdict().items() if v is not None}
                    out.append(fill(rule.text, {**groups, **captured}))
                    break
        return "\n".join(out)

    def placeholders(self, defined: set[str] | None = None) -> set[str]:
        """Names of the `{name}` placeholders the reply uses (`{turn}` in ids aside) that
        `defined` (the `when` groups) does not define; a `lines` rule's own groups count as
        defined for its text."""
        defined = defined or set()
        names = set(PLACEHOLDER.findall(self.text or ""))
        for rule in self.lines or []:
            names.update(set(PLACEHOLDER.findall(rule.text)) - set(rule.pattern.groupindex))

        def collect(text: str) -> str:
            names.update(PLACEHOLDER.findall(text))
            return text

        for call in self.tool_calls or []:
            names.update(set(PLACEHOLDER.findall(call.id)) - {"turn"})
            map_strings(call.arguments, collect)
        return names - defined


class When(_Strict):
    """Regexes a request must match (`re.search`); a key left out matches anything."""

    model: str | None = None
    system: str | None = None
    user: str | None = None
    transcript: str | None = None
    tool_results: str | None = None

    @model_validator(mode="after")
    def _compiles(self) -> When:
        _ = self.patterns  # compiled at load: a bad regex fails here, not on a request
        return self

    # A cached_property, not a pydantic private attribute: reading one of those costs ~4 µs.
    @cached_property
    def patterns(self) -> tuple[tuple[str, re.Pattern[str]], ...]:
        """(key, compiled regex) of each given key; `re`'s own cache thrashes past 512."""
        compiled = []
        for key in WHEN_KEYS:
            if (pattern := getattr(self, key)) is not None:
                try:
                    compiled.append((key, re.compile(pattern)))
                except re.error as exc:
                    raise ValueError(f"{key}: regex {pattern!r} does not compile: {exc}") from exc
        return tuple(compiled)

    @property
    def group_names(self) -> set[str]:
        """Names of the groups the regexes define, i.e. the placeholders replies may use."""
        return {name for _, pattern in self.patterns for name in pattern.groupindex}

    @property
    def literal_model(self) -> str | None:
        """The model name when `model` is an exact literal (`^name$`), else None."""
        pattern = self.model
        if pattern is None or len(pattern) < 2 or pattern[0] != "^" or pattern[-1] != "$":
            return None
        name = pattern[1:-1]
        return None if _REGEX_SPECIAL.intersection(name) else name

    def match(self, view: ConversationView) -> dict[str, str] | None:
        """The named groups captured when every given regex is found, else None."""
        groups: dict[str, str] = {}
        for key, pattern in self.patterns:
            found = pattern.search(getattr(view, key))
            if found is None:
                return None
            if pattern.groupindex:
                for name, value in found.groupdict().items():
                    if value is not None:
                        groups.setdefault(name, value)
        return groups

    def matches(self, view: ConversationView) -> bool:
        """True when every given regex is found in the matching part of the request."""
        return self.match(view) is not None


class Fault(_Strict):
    """A scripted failure: an HTTP error status (with a JSON or, `html`, an HTML error page
    as a proxy sends), a malformed body, a connection `reset` mid-body, or a hang first."""

    turn: int | None = Field(default=None, ge=0, description="None: every turn")
    status: int | None = Field(default=None, ge=400, le=599)
    retry_after: float | None = Field(default=None, ge=0)
    times: int | None = Field(default=None, ge=1, description="None: fires every time")
    malformed: bool = False
    hang_ms: float = Field(default=0, ge=0)
    html: bool = False
    reset: bool = False

    @model_validator(mode="after")
    def _one_effect(self) -> Fault:
        if sum([self.status is not None, self.malformed, self.reset]) > 1:
            raise ValueError("a fault has one of `status`, `malformed` or `reset`")
        if self.status is None and not self.malformed and not self.reset and not self.hang_ms:
            raise ValueError("a fault needs `status`, `malformed`, `reset` or `hang_ms`")
        if self.html and self.status is None:
            raise ValueError("`html` only goes with `status`")
        if self.retry_after is not None and self.status is None:
            raise ValueError("`retry_after` only goes with `status`")
        return self

    def applies_to(self, turn: int) -> bool:
        """True when this fault is scripted for `turn` (ignoring how often it has fired)."""
        return self.turn is None or self.turn == turn


class Script(_Strict):
    """One scripted conversation: when it answers, and what it says turn by turn."""

    name: str = Field(min_length=1)
    when: When = When()
    replies: list[Reply] = Field(min_length=1)
    latency_ms: float = Field(default=0, ge=0)
    after_last: Literal["repeat_last", "error"] = "error"
    faults: list[Fault] = Field(default_factory=list)

    @model_validator(mode="after")
    def _placeholders_are_groups(self) -> Script:
        defined = self.when.group_names
        for index, reply in enumerate(self.replies):
            if unknown := sorted(reply.placeholders(defined)):
                used = ", ".join(f"{{{name}}}" for name in unknown)
                groups = ", ".join(sorted(defined)) or "none"
                raise ValueError(
                    f"replies.{index}: {used} names no group of the `when` regexes "
                    f"(their named groups: {groups})"
                )
        return self

    def reply_for(self, turn: int) -> Reply | None:
        """The reply for `turn`, or None when the script has run out and must error."""
        if turn < len(self.replies):
            return self.replies[turn]
        return self.replies[-1] if self.after_last == "repeat_last" else None


class ScriptMatch(NamedTuple):
    """The script that answers a request, and the named groups its regexes captured."""

    script: Script
    groups: Mapping[str, str]


@dataclass(frozen=True)
class ModelIndex:
    """Positions in a scenario's scripts: by exact model name, and those tried for any model."""

    by_model: dict[str, list[int]]
    unindexed: list[int]

    def candidates(self, model: str) -> Iterable[int]:
        """Positions of the scripts that can match `model`, in file order."""
        # `^name$` also matches "name\n", so that request is looked up as "name".
        indexed = self.by_model.get(model.removesuffix("\n"), [])
        if indexed and self.unindexed:
            return heapq.merge(indexed, self.unindexed)
        return indexed or self.unindexed


class Scenario(BaseModel):
    """The scripts of one scenario file, in the order they are tried."""

    model_config = ConfigDict(frozen=True)

    source: str
    scripts: list[Script]

    @model_validator(mode="after")
    def _indexed(self) -> Scenario:
        _ = self.index  # built at load, not on the first request
        return self

    @cached_property
    def index(self) -> ModelIndex:
        """The scripts whose `model` regex is an exact literal, by that name; and the rest."""
        index = ModelIndex({}, [])
        for position, script in enumerate(self.scripts):
            name = script.when.literal_model
            if name is None:
                index.unindexed.append(position)
            else:
                index.by_model.setdefault(name, []).append(position)
        return index

    def match(self, view: ConversationView) -> ScriptMatch | None:
        """The first script in file order whose `when` matches, with its groups; or None."""
        scripts = self.scripts
        for position in self.index.candidates(view.model):
            groups = scripts[position].when.match(view)
            if groups is not None:
                return ScriptMatch(scripts[position], groups)
        return None


# --- loading -------------------------------------------------------------------------------


def builtin_names() -> list[str]:
    """Names of the scenario sets shipped in the package (`harness`, ...)."""
    folder = resources.files(BUILTIN_PACKAGE).joinpath(BUILTIN_FOLDER)
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_scenario(source: str | Path) -> Scenario:
    """Load a scenario from a YAML/JSON file path or a built-in set name; ScenarioError if bad."""
    label, text = _read_source(source)
    try:
        data = json.loads(text) if label.endswith(".json") else yaml.load(text, _YAML_LOADER)
    except (ValueError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{label}: not valid YAML/JSON: {exc}") from exc
    if not isinstance(data, list):
        raise ScenarioError(f"{label}: the top level must be a list of scripts")
    scripts = [_validate_script(label, index, item) for index, item in enumerate(data)]
    names = Counter(s.name for s in scripts)
    if duplicates := sorted(name for name, count in names.items() if count > 1):
        raise ScenarioError(f"{label}: script names must be unique: {', '.join(duplicates)}")
    return Scenario(source=label, scripts=scripts)


def _read_source(source: str | Path) -> tuple[str, str]:
    """(label for messages, text) of a file path, else of a built-in set."""
    path = Path(source)
    if path.is_file():
        return str(path), path.read_text(encoding="utf-8")
    builtin = resources.files(BUILTIN_PACKAGE).joinpath(BUILTIN_FOLDER, f"{source}.yaml")
    if isinstance(source, str) and builtin.is_file():
        return f"{source}.yaml", builtin.read_text(encoding="utf-8")
    raise ScenarioError(
        f"{source}: no such scenario file or built-in set (built-ins: {', '.join(builtin_names())})"
    )


def _validate_script(label: str, index: int, item: Any) -> Script:
    """Validate one script; its errors name the file, the script and the field."""
    try:
        return Script.model_validate(item)
    except ValidationError as exc:
        name = item.get("name") if isinstance(item, dict) else None
        who = f"script #{index}" + (f" ({name!r})" if name else "")
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '(script)'}: {error['msg']}"
            for error in exc.errors()
        )
        raise ScenarioError(f"{label}: {who}: {problems}") from exc


# --- placeholders ----------------------------------------------------------------------------


def fill(template: str, groups: Mapping[str, str]) -> str:
    """`template` with each `{name}` of a captured group replaced; any other braces kept."""
    if not groups or "{" not in template:
        return template
    return PLACEHOLDER.sub(lambda found: groups.get(found[1], found[0]), template)


def map_strings(value: Any, change: Callable[[str], str]) -> Any:
    """`value` with `change` applied to every string in it, walking mappings and lists."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {key: map_strings(item, change) for key, item in value.items()}
    if isinstance(value, list):
        return [map_strings(item, change) for item in value]
    return value
