"""The built-in tools a worker may name in its `tools` list: reading, listing and searching the
files it may read (its `reads`), and looking a key up in a JSON file among them. Written
with the same `@tool` a team's own tools use."""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import Field

from workers.errors import ToolError
from workers.tools import Tool, ToolContext, tool

SEARCH_HITS = 50  # lines a search returns at most


@tool
def read_file(
    path: Annotated[str, Field(description="file name relative to the workspace, e.g. errors.log")],
    ctx: ToolContext,
) -> str:
    """Read one file of the workspace."""
    return ctx.readable().read(path)


@tool
def list_files(ctx: ToolContext) -> str:
    """List the files this worker may read, one path per line."""
    return "\n".join(ctx.readable().files()) or "(no files)"


@tool
def search_files(
    text: Annotated[str, Field(min_length=2, description="a word or phrase, any case")],
    ctx: ToolContext,
) -> str:
    """Find a word or phrase in the files this worker may read: each matching line with its
    file and line number."""
    files, wanted = ctx.readable(), text.lower()
    hits = []
    for name in files.files():
        try:
            lines = files.read(name).splitlines()
        except ToolError:
            continue  # not text
        hits += [f"{name}:{n}: {line}" for n, line in enumerate(lines, 1) if wanted in line.lower()]
        if len(hits) >= SEARCH_HITS:
            break
    return "\n".join(hits[:SEARCH_HITS]) or f"no line mentions {text!r}"


@tool
def lookup_json(
    file: Annotated[
        str, Field(description="a JSON file this worker may read, e.g. data/orders.json")
    ],
    key: Annotated[str, Field(description="the key to look up, exactly as written")],
    ctx: ToolContext,
) -> str:
    """Look up one key of the JSON object in a file this worker may read."""
    try:
        table = json.loads(ctx.readable().read(file))
    except ValueError as exc:
        raise ToolError(f"{file} is not JSON: {exc}") from exc
    if not isinstance(table, dict):
        raise ToolError(f"{file} holds no JSON object to look keys up in")
    if key not in table:
        raise ToolError(f"{file} has no key {key!r}")
    return json.dumps(table[key], ensure_ascii=False)


BUILTINS: dict[str, Tool] = {t.name: t for t in (read_file, list_files, search_files, lookup_json)}
