"""`ticketgraph keys`: the key pairs that sign people's decisions (run/signing.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from orchestrator.cli.options import workspace_option

if TYPE_CHECKING:
    from orchestrator.config.workspace import Workspace


def set_up(workspace: Workspace) -> str:
    """Make this user's key pair if there is none, trust its public half in `workspace`;
    what was done."""
    from orchestrator.run import signing

    done = signing.set_up(workspace)
    if not done:
        return f"your signing key ({signing.private_path()}) is trusted here already\n"
    return "".join(f"{line}\n" for line in done)


@click.group("keys")
def keys() -> None:
    """The keys that sign people's decisions (approve, reject): the private half in your
    configuration folder, the public half in the workspace's keys/, where every worker
    verifies decisions with it."""


@keys.command("init")
@workspace_option
def keys_init(workspace: Workspace) -> int:
    """Set up your signing key for this workspace.

    Make your key pair if you have none ($XDG_CONFIG_HOME/ticketgraph/signing.key, default
    ~/.config/ticketgraph/, readable by you alone; TICKETGRAPH_SIGNING_KEY names another
    file), and add its public half to the workspace's keys/ so that workers trust decisions
    you sign. Copy keys/ to every worker that does not see the workspace folder (or point
    TICKETGRAPH_TRUSTED_KEYS at a copy). Run it once per person who decides.
    """

    print(set_up(workspace.require()), end="")
    return 0


COMMANDS = (keys,)
