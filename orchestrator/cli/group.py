"""How every `ticketgraph` command is parsed and explained: help as Unix tools write it
(`usage:`), 100 columns at most, and a misspelt command told the closest one."""

from __future__ import annotations

import difflib

import click

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _Formatter(click.HelpFormatter):
    """Help as click writes it, with `usage:` as every Unix tool (and argparse) spells it."""

    def write_usage(self, prog: str, args: str = "", prefix: str | None = None) -> None:
        """The usage line."""
        super().write_usage(prog, args, "usage: " if prefix is None else prefix)


class Context(click.Context):
    """A command's context, whose help is written by `_Formatter`."""

    formatter_class = _Formatter


class Command(click.Command):
    """A command of the group."""

    context_class = Context


class Commands(click.Group):
    """A group of commands: a misspelt command is told the closest one."""

    context_class = Context
    command_class = Command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """The command `args` names; a usage error naming the closest if none."""
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=1, cutoff=0.5)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            known = ", ".join(self.list_commands(ctx))
            raise click.UsageError(f"No such command {name!r}.{hint} (commands: {known})", ctx)
        return super().resolve_command(ctx, args)


def explain_alike(group: click.Group) -> None:
    """Every command under `group`, nested ones and those declared with plain click (the
    person's, eval, keys, the provider's), writes its help and usage as `Context` does."""
    for command in group.commands.values():
        command.context_class = Context
        if isinstance(command, click.Group):
            explain_alike(command)
