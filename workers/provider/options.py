"""The provider's command (`ticketgraph provider`, `python -m workers.provider.server`),
importable without the server's weight: `ticketgraph --help` builds every command, and
importing uvicorn and the scenario models for that alone cost 160 ms per invocation.
"""

from __future__ import annotations

import click

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8400

HELP = """\
Serve scripted chat completions (OpenAI wire format) at http://HOST:PORT/v1.

A scenario file (YAML or JSON) is a list of scripts. The first script whose `when` regexes
all match the request answers it; its reply is picked by the turn index, i.e. the number of
assistant messages in the request:

\b
  - name: plan
    when: {model: "^plan$"}    # also: system, user, transcript, tool_results
    replies:
      - tool_calls: [{id: c1, name: list_files, arguments: {}}]
      - text: "done"
    after_last: error            # or repeat_last
    latency_ms: 0
    # faults also: malformed, reset, hang_ms, status + html
    faults: [{turn: 0, status: 429, retry_after: 1, times: 1}]

A reply is {text: ...} or {tool_calls: [{id, name, arguments}]}; arguments are a mapping
(sent as compact JSON) or a string, and "{turn}" in an id becomes the turn index. Usage is
counted with o200k_base unless a reply fixes it: usage: {prompt_tokens, completion_tokens}.

Placeholders: "{name}" in a reply's text, its ids and any string in its arguments becomes
what the named group `name` of the script's `when` regexes captured:

\b
  - name: ticket
    when: {user: '^Ticket id: (?P<ticket>\\S+)'}
    replies:
      - text: "Ticket {ticket}: resolved."

Other braces (JSON in a reply) are left alone; a "{name}" that no `when` regex of the script
defines as a group is an error when the file loads.

A reply may answer line by line instead: {lines: [{match: REGEX, text: LINE}], max_lines: N}
adds, for each line of the request's first user message, the `text` of the first rule whose
`match` is found in it (filled from its named groups), at most N lines; a router asked about
a batch of tickets answers exactly those:

\b
      - lines: [{match: '^(?P<ticket>T-\\d+): ', text: "{ticket}: billing"}]

A text reply longer than the request's max_tokens is cut there, with finish_reason length.

Scripts are tried in file order, first match wins. A `model` regex that is an exact literal
("^name$", no regex metacharacters) is looked up by name instead of tried, so thousands of
per-model scripts cost a request about as much as a few.

Other endpoints: POST /v1/messages (the same scripts in Anthropic's Messages shape), GET
/stats (requests, tokens, per-script counts, the max_tokens/temperature each script saw, the
tools each script's last request offered, protocol_errors: requests a strict endpoint would
refuse for a tool call left unanswered or an id used twice, and cpu_s: the process's CPU
seconds since start or reset), POST /stats/reset, GET /healthz.
Faults: status (+ retry_after, + html: a proxy's error page), malformed, reset (the
connection drops mid-body), hang_ms.

A cassette (`ticketgraph run --record CASSETTE`, or --record here) given as --scenarios is
replayed: each request is answered with the response recorded for the same model, system
prompt, messages and tools, and a request it does not hold is answered 400 with what differs.
"""


@click.command(
    "provider",
    help=HELP,
    short_help="Serve the scripted OpenAI-compatible model over HTTP.",
    context_settings={"max_content_width": 100},
)
@click.option(
    "--scenarios",
    default="harness",
    show_default=True,
    metavar="FILE_OR_BUILTIN",
    help="A scenario file (YAML or JSON), or the name of a built-in set such as harness.",
)
@click.option("--host", default=DEFAULT_HOST, show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True)
@click.option(
    "--tpm-limit",
    type=click.IntRange(min=1),
    help="Answer 429 (with Retry-After) to a request whose tokens would take the last "
    "--tpm-window-s seconds over this many, as a rate-limited hosted API does.",
)
@click.option(
    "--tpm-window-s",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="The window --tpm-limit counts over.",
)
@click.option(
    "--record",
    metavar="CASSETTE",
    help="Do not script: forward every request to --upstream and keep each exchange in "
    "CASSETTE (a JSON file, appended to), to replay later with --scenarios CASSETTE.",
)
@click.option("--upstream", metavar="URL", help="With --record: the real model's base URL (…/v1).")
def command(
    scenarios: str,
    host: str,
    port: int,
    tpm_limit: int | None,
    tpm_window_s: float,
    record: str | None,
    upstream: str | None,
) -> int:
    """Serve the scripted OpenAI-compatible model over HTTP."""
    if record is not None:
        if not upstream:
            raise click.UsageError("--record needs --upstream URL, the model to record")
        from pathlib import Path

        # Lazy, as the server below: --help must not import the recorder.
        from workers.provider.recorder import server

        print(f"recording {upstream} into {record} at http://{host}:{port}/v1", flush=True)
        server(Path(record), upstream, host, port).run()
        return 0
    # Lazy, and the one way back up in workers/provider/ (tests/test_layers.py lists it):
    # the server imports these options, and --help must not import the server.
    from workers.provider.server import run_from_options

    return run_from_options(scenarios, host, port, tpm_limit, tpm_window_s)
