"""A worker prompt's four elements (seed 003): goal, output format, tool guidance and task
limits. `ticketgraph check` warns, naming what a prompt lacks; a run still starts.

Each element is found by its label ("Goal:", "Output format:", "Tool guidance:", "Task
limits:", as the demo's prompts write them) or by words that do its job ("your task is",
"reply with", "use read_file", "do not"): a prompt in other words still passes, a prompt
that never says how to answer does not.
"""

from __future__ import annotations

import re

ELEMENTS: dict[str, re.Pattern[str]] = {
    "goal": re.compile(r"\b(goal|objective|purpose|your (job|task) is)\b", re.I),
    "output format": re.compile(
        r"\b(output|format|reply (with|as|in)|answer (with|as|in)|respond (with|as|in))\b", re.I
    ),
    "tool guidance": re.compile(r"\b(tools?|use [a-z]+_[a-z_]+)\b", re.I),
    "task limits": re.compile(r"\b(limits?|do not|don't|never|must not|only)\b", re.I),
}


def lacks(prompt: str) -> list[str]:
    """The elements `prompt` does not state, in the seed's order (empty: it has all four)."""
    return [name for name, pattern in ELEMENTS.items() if not pattern.search(prompt)]


def warning(who: str, prompt: str) -> str | None:
    """One line naming what `who`'s prompt lacks, or None."""
    missing = lacks(prompt)
    if not missing:
        return None
    return (
        f"warning: {who}'s prompt states no {', no '.join(missing)} (a prompt states its "
        "goal, output format, tool guidance and task limits: a model guesses the rest)"
    )
