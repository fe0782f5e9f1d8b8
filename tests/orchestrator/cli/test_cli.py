"""The command line: --help everywhere, clear errors for bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.broker.redis_server import free_port
from orchestrator.exit_codes import ExitCode
from tests.conftest import Cli, demo_scripts, drop, settled, state, variant, write_scenarios
from workers import versions

COMMANDS = [
    "init",
    "run",
    "resume",
    "requeue",
    "status",
    "worker",
    "harness",
    "provider",
    "scenarios",
]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_explains_itself(cli: Cli, tmp_path: Path, command: str) -> None:
    done = cli(command, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout and len(done.stdout.splitlines()) > 4


def test_top_level_help_lists_the_commands(cli: Cli, tmp_path: Path) -> None:
    done = cli("--help", cwd=tmp_path)
    assert done.returncode == 0
    for command in COMMANDS:
        assert command in done.stdout


def test_run_without_an_inbox_says_so(cli: Cli, tmp_path: Path) -> None:
    done = cli("run", cwd=tmp_path)
    assert done.returncode == 64
    assert "no inbox folder" in done.stderr and "ticketgraph init" in done.stderr


def test_a_bad_ticket_is_quarantined_and_the_batch_goes_on(cli: Cli, demo: Path) -> None:
    drop(demo / "inbox", "T-9.json", "{nope")
    done = cli("run", cwd=demo)
    assert done.returncode == 1, done.stderr
    assert "1 file quarantined" in done.stdout
    record = state(demo)
    assert len(record["tickets"]) == 6
    (rejected,) = record["rejected"]
    assert rejected["file"] == f"quarantine/{record['run_id']}/T-9.json"
    assert "T-9.json" in (demo / f"{rejected['file']}.reason").read_text()
    assert "quarantine/" in done.stdout  # the report lists it


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ("[graph]\npool_size = 0\n", "[graph] pool_size"),
        ("[gate]\nfiler_phrases = []\n", "[gate] filer_phrases: unknown key"),
        ('[graph]\ncategories = ["other"]\n', "no [workers.<category>] table"),
        ("[inbox]\nmax_bytes = -1\n", "[inbox] max_bytes"),
        ("[nope]\n", "nope: unknown key"),
    ],
)
def test_a_bad_config_is_refused_before_anything_is_claimed(
    cli: Cli, demo: Path, toml: str, named: str
) -> None:
    (demo / "ticketgraph.toml").write_text(toml)
    done = cli("run", cwd=demo)
    assert done.returncode == 78, done.stderr
    assert named in done.stderr
    assert len(list((demo / "inbox").iterdir())) == 6 and not (demo / "runs").exists()


def test_stop_after_accepts_only_stop_points_that_exist(cli: Cli, demo: Path) -> None:
    done = cli("run", cwd=demo, env={"STOP_AFTER": "review"})
    assert done.returncode == 78, done.stderr
    assert "route" in done.stderr and "merge" in done.stderr


@pytest.mark.parametrize("run_id", ["../../elsewhere/run-1", "..", "run-1/../..", "run 1"])
def test_a_run_id_is_never_a_path(cli: Cli, demo: Path, tmp_path: Path, run_id: str) -> None:
    elsewhere = tmp_path / "elsewhere" / "run-1"
    elsewhere.mkdir(parents=True)
    (elsewhere / "run.json").write_text("{}")
    for command in ("resume", "requeue"):
        done = cli(command, run_id, cwd=demo)
        assert done.returncode == 64, done.stderr
        assert "is not a run id" in done.stderr


def test_resume_of_an_unknown_run(cli: Cli, demo: Path) -> None:
    done = cli("resume", "run-nope", cwd=demo)
    assert done.returncode == 64
    assert "no run 'run-nope'" in done.stderr


def test_worker_needs_a_broker_and_a_model(cli: Cli, tmp_path: Path) -> None:
    done = cli("worker", cwd=tmp_path)
    assert done.returncode == 78 and "TICKETGRAPH_BROKER_URL" in done.stderr
    done = cli("worker", cwd=tmp_path, env={"TICKETGRAPH_BROKER_URL": "redis://127.0.0.1:1/0"})
    assert done.returncode == 78 and "LLM_BASE_URL" in done.stderr


def test_an_empty_inbox_is_a_clean_run_that_leaves_nothing(cli: Cli, demo: Path) -> None:
    for ticket in (demo / "inbox").iterdir():
        ticket.unlink()
    done = cli("run", cwd=demo)
    assert done.returncode == 0, done.stderr
    assert "nothing to claim" in done.stdout
    assert not (demo / "runs").exists()


def test_a_file_still_being_written_is_not_claimed(cli: Cli, demo: Path) -> None:
    for ticket in (demo / "inbox").iterdir():
        ticket.unlink()
    # A minute's settle time, so "just written" holds however slowly the command starts.
    config = demo / "ticketgraph.toml"
    config.write_text(re.sub(r"(?m)^settle_s = .*$", "settle_s = 60", config.read_text()))
    (demo / "inbox" / "T-7.txt").write_text("just written, maybe not finished")
    (demo / "inbox" / ".T-8.txt").write_text("a dotfile: still being written elsewhere")
    done = cli("run", cwd=demo)
    assert done.returncode == 0 and "nothing to claim" in done.stdout, done.stderr
    assert sorted(p.name for p in (demo / "inbox").iterdir()) == [".T-8.txt", "T-7.txt"]


def test_requeue_puts_a_runs_tickets_back(cli: Cli, demo: Path) -> None:
    first = cli("run", "--stop-after", "route", cwd=demo)
    assert first.returncode == 2, first.stderr
    run_id = state(demo)["run_id"]
    done = cli("requeue", run_id, "T-1002", "T-1005", cwd=demo)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (demo / "inbox").iterdir()) == ["T-1002.txt", "T-1005.txt"]
    unknown = cli("requeue", run_id, "T-9999", cwd=demo)
    assert unknown.returncode == 64 and "T-9999" in unknown.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LLM_READ_TIMEOUT_S", "abc"),
        ("LLM_MAX_RETRIES", "-1"),
        ("TICKETGRAPH_POOL_SIZE", "0"),
        ("POOL_SIZE", "abc"),  # the short alias: named as written, not as TICKETGRAPH_...
        ("TICKETGRAPH_BROKER_OUTAGE_S", "soon"),
        ("TICKETGRAPH_BROKER_URL", "amqpx://127.0.0.1:5672//"),  # not a Redis URL
        ("TICKETGRAPH_BROKER_URL", "unix://"),  # no socket path
        ("LLM_BASE_URL", "not-a-url"),
        ("LLM_BASE_URL", "ftp://models.example/v1"),
        ("TICKETGRAPH_RUN_TIMEOUT_S", "0"),
    ],
)
def test_a_bad_setting_is_one_sentence_naming_it_before_anything_is_claimed(
    demo: Path, cli: Cli, variable: str, value: str
) -> None:
    done = cli("run", cwd=demo, env={variable: value})
    assert done.returncode == 78
    assert done.stderr.count("\n") == 1 and f"{variable}='{value}'" in done.stderr
    assert len(list((demo / "inbox").iterdir())) == 6  # nothing claimed
    harness = cli("harness", "plan", cwd=demo, env={variable: value})
    if variable.startswith("LLM_"):
        assert harness.returncode == 78 and variable in harness.stderr


def test_an_api_key_a_header_cannot_carry_is_refused_unprinted_before_anything_is_claimed(
    demo: Path, cli: Cli
) -> None:
    """README's crontab placeholder `sk-…` pasted as it is: one sentence naming the variable,
    never the key, and nothing claimed (it crashed the run, after claiming, in httpx)."""
    done = cli("run", cwd=demo, env={"LLM_API_KEY": "sk-proj-secret…"})
    assert done.returncode == 78, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "LLM_API_KEY" in done.stderr
    assert "secret" not in done.stderr
    assert len(list((demo / "inbox").iterdir())) == 6


def test_an_endpoint_that_refuses_connections_fails_the_harness_and_stops_a_run_unclaimed(
    demo: Path, cli: Cli
) -> None:
    """The endpoint is down: the harness exits 3, and `run` refuses before it claims
    anything (78, a setting to fix); both say on stderr which URL failed."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    env = {"LLM_BASE_URL": url, "LLM_MAX_RETRIES": "0"}
    inbox = sorted(p.name for p in (demo / "inbox").iterdir())
    harness = cli("harness", "plan", cwd=demo, env=env)
    graph = cli("run", cwd=demo, env=env)
    assert harness.returncode == 3, harness.stderr
    assert graph.returncode == ExitCode.CONFIG, graph.stdout + graph.stderr
    assert url in harness.stderr and url in graph.stderr
    assert sorted(p.name for p in (demo / "inbox").iterdir()) == inbox


def test_the_harness_charges_llm_prices(demo: Path, cli: Cli) -> None:
    prices = '{"default": {"input_per_million": 4.0, "output_per_million": 24.0}}'
    base = cli("harness", "plan", "--json", cwd=demo)
    doubled = cli("harness", "plan", "--json", cwd=demo, env={"LLM_PRICES": prices})
    assert base.returncode == doubled.returncode == 0, base.stderr + doubled.stderr
    cost = json.loads(base.stdout)["cost_usd"]
    assert cost > 0 and json.loads(doubled.stdout)["cost_usd"] == pytest.approx(2 * cost)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--stop-afer", "merge"],  # a misspelt flag
        ["run", "--pool-size", "0"],
        ["run", "--pool-size", "-1"],
        ["run", "--pool-size", "abc"],
        ["frobnicate"],
        [],
        ["worker", "--threads", "0"],
        ["run", "--timeout", "-5"],
        ["run", "--timeout", "0"],
    ],
)
def test_usage_errors_exit_64_with_one_message_and_create_nothing(
    cli: Cli, demo: Path, argv: list[str]
) -> None:
    """Not 2, which cron reads as "stopped early"; nothing is claimed or created."""
    done = cli(*argv, cwd=demo)
    assert done.returncode == 64, done.stderr
    assert "error:" in done.stderr and "Traceback" not in done.stderr
    assert not (demo / "runs").exists() or not list((demo / "runs").iterdir())
    assert len(list((demo / "inbox").iterdir())) == 6


def test_version(cli: Cli, demo: Path) -> None:
    done = cli("--version", cwd=demo)
    assert done.returncode == 0 and done.stdout.startswith("ticketgraph 0.")


@pytest.mark.parametrize(
    ("table", "written", "meant"),
    [
        ("graph", "poolsize = 5", "pool_size"),
        ("gate", 'filer_phrases = ["x"]', "filler_phrases"),
        ("inbox", "max_byte = 10", "max_bytes"),
        ("harness", "max_turn = 3", "max_turns"),
        ("evaluator", "enable = true", "enabled"),
        ("harness.router", "max_token = 9", "max_tokens"),
        ("workers.billing", 'prompt_fil = "p.md"', "prompt_file"),
        ("workers.bug", "budget = 0.1", "budget_usd"),
        ("workers.bug", 'read = ["kb"]', "reads"),
        ("templates.other", 'files = "x.txt"', "file"),
        ("prices", "defaults = {}", "default"),
        ("prices.models", '"m" = { input_per_milion = 1.0 }', "input_per_million"),
    ],
)
def test_an_unknown_key_is_refused_with_the_closest_valid_one(
    cli: Cli, demo: Path, table: str, written: str, meant: str
) -> None:
    config = demo / "ticketgraph.toml"
    header = rf"^\[{re.escape(table)}\].*$"
    text, added = re.subn(header, rf"\g<0>\n{written}", config.read_text(), count=1, flags=re.M)
    config.write_text(text if added else f"{text}\n[{table}]\n{written}\n")
    done = cli("run", cwd=demo)
    assert done.returncode == 78, done.stderr
    assert f"did you mean '{meant}'?" in done.stderr
    assert len(list((demo / "inbox").iterdir())) == 6


def test_status_shows_a_run_for_a_person_and_for_a_program(cli: Cli, demo: Path) -> None:
    """`status` (the newest run) and `status RUN_ID --json`, read from the run's folder; the
    document's record is a RunRecord (the documented schema) and matches run-state.json."""
    from orchestrator.run.records import RunRecord

    assert cli("status", cwd=demo).returncode == 64  # no run yet
    assert cli("run", cwd=demo).returncode == 1
    shown = cli("status", cwd=demo)
    assert shown.returncode == 0, shown.stderr
    assert "done, exit 1; 6 tickets" in shown.stdout and "T-1004 (no_progress)" in shown.stdout
    run_id = state(demo)["run_id"]
    done = cli("status", run_id, "--json", cwd=demo)
    doc = json.loads(done.stdout)
    assert (doc["schema_version"], doc["run_id"], doc["exit_code"]) == (1, run_id, 1)
    assert doc["by_status"] == {"pass": 5, "needs_human": 1}
    assert doc["cost_usd"] == pytest.approx(
        sum(n["cost_usd"] for n in state(demo)["nodes"].values())
    )
    record = RunRecord.model_validate(doc["record"])
    assert record.model_dump(mode="json") == RunRecord.model_validate(state(demo)).model_dump(
        mode="json"
    )


@pytest.mark.parametrize(
    ("table", "written", "says"),
    [
        ("graph", "pool_size = 0", "[graph] pool_size: Input should be greater than or equal to 1"),
        ("gate", "max_rounds = -1", "[gate] max_rounds: Input should be greater than or equal"),
        ("harness", "max_turns = 0", "[harness] max_turns: Input should be greater than or equal"),
    ],
)
def test_a_value_out_of_range_in_the_config_is_refused_naming_its_key(
    cli: Cli, demo: Path, table: str, written: str, says: str
) -> None:
    config = demo / "ticketgraph.toml"
    header = rf"^\[{re.escape(table)}\].*$"
    text = re.sub(header, rf"\g<0>\n{written}", config.read_text(), count=1, flags=re.M)
    config.write_text(_only(text, written))
    done = cli("run", cwd=demo)
    assert done.returncode == 78 and says in done.stderr, done.stderr
    assert len(list((demo / "inbox").iterdir())) == 6


def _only(text: str, written: str) -> str:
    """`text` with `written` kept and any later line setting the same key removed."""
    key = written.split(" =")[0]
    head, tail = text.split(written, 1)
    return head + written + re.sub(rf"^{re.escape(key)} = .*$", "", tail, count=1, flags=re.M)


def test_flags_win_over_the_environment_which_wins_over_the_config(cli: Cli, demo: Path) -> None:
    """defaults < ticketgraph.toml < environment < flags, read off the run's record."""
    config = demo / "ticketgraph.toml"
    config.write_text(config.read_text().replace("pool_size = 2", "pool_size = 3"))

    def pool(*flags: str, env: dict[str, str] | None = None) -> int:
        done = cli("run", "--stop-after", "route", *flags, cwd=demo, env=env)
        assert done.returncode == 2, done.stderr
        run_id = state(demo)["run_id"]
        assert cli("requeue", run_id, cwd=demo).returncode == 0
        for ticket in (demo / "inbox").iterdir():
            settled(ticket)
        return int(state(demo)["config"]["pool_size"])

    assert pool() == 3
    assert pool(env={"POOL_SIZE": "4"}) == 4
    assert pool("--pool-size", "5", env={"POOL_SIZE": "4"}) == 5


def test_a_misspelt_variable_of_ours_is_refused_with_the_closest_one(cli: Cli, demo: Path) -> None:
    done = cli("run", cwd=demo, env={"TICKETGRAPH_POOLSIZE": "3"})
    assert done.returncode == 78
    assert done.stderr == (
        "ticketgraph run: TICKETGRAPH_POOLSIZE is not a setting; "
        "did you mean TICKETGRAPH_POOL_SIZE?\n"
    )
    assert len(list((demo / "inbox").iterdir())) == 6
    worker = cli("worker", cwd=demo, env={"TICKETGRAPH_BROKER_OUTAGE": "5"})
    assert worker.returncode == 78 and "TICKETGRAPH_BROKER_OUTAGE_S?" in worker.stderr


def test_the_lease_is_a_setting_and_a_lease_too_short_to_renew_is_refused(
    cli: Cli, demo: Path
) -> None:
    """TICKETGRAPH_LEASE_S (README's settings; test_budget.py shows a run and its workers
    use it) is checked like any other: below a second, each command says so and exits 78."""
    for command in ("run", "worker"):
        done = cli(command, cwd=demo, env={"TICKETGRAPH_LEASE_S": "0.5"})
        assert done.returncode == 78, done.stderr
        assert "TICKETGRAPH_LEASE_S='0.5'" in done.stderr and "not a setting" not in done.stderr
        assert done.stderr.count("\n") == 1
    assert len(list((demo / "inbox").iterdir())) == 6


def test_the_environment_wins_over_a_roles_own_table(cli: Cli, demo: Path) -> None:
    """[harness.router] model is the router's; LLM_MODEL, set for every role, wins over it."""
    config = demo / "ticketgraph.toml"
    config.write_text(
        config.read_text().replace("[harness.router]", '[harness.router]\nmodel = "router-x"\n#', 1)
    )

    def router_model(env: dict[str, str] | None = None) -> str:
        done = cli("run", "--stop-after", "route", cwd=demo, env=env)
        assert done.returncode == 2, done.stderr
        run_id = state(demo)["run_id"]
        assert cli("requeue", run_id, cwd=demo).returncode == 0
        for ticket in (demo / "inbox").iterdir():
            settled(ticket)
        agent = demo / "runs" / run_id / "agents" / "_router.route.json"
        return str(versions.read_json(agent)["model"])

    assert router_model() == "router-x"
    assert router_model({"LLM_MODEL": "small-1"}) == "small-1"


def test_a_broker_flag_that_is_not_a_redis_url_is_refused_before_anything_is_claimed(
    cli: Cli, demo: Path
) -> None:
    for command in (["run"], ["worker"], ["flower", "--no-auth"]):
        done = cli(
            *command,
            "--broker",
            "amqpx://ops:s3cret@127.0.0.1:5672//",
            cwd=demo,
            env={"LLM_BASE_URL": "http://127.0.0.1:9/v1"},
        )
        assert done.returncode == 78, done.stderr
        assert done.stderr.count("\n") == 1 and "not a Redis URL" in done.stderr, done.stderr
        assert "s3cret" not in done.stderr and "Traceback" not in done.stderr
    assert len(list((demo / "inbox").iterdir())) == 6


def test_time_limits_that_cannot_work_are_named_as_set(cli: Cli, demo: Path) -> None:
    done = cli("run", cwd=demo, env={"TICKETGRAPH_SOFT_TIME_LIMIT_S": "700"})
    assert done.returncode == 78
    assert (
        "TICKETGRAPH_SOFT_TIME_LIMIT_S (700) must be less than TICKETGRAPH_TIME_LIMIT_S (660)"
        in done.stderr
    ), done.stderr


@pytest.mark.parametrize("folder", ["out", "runs", "quarantine"])
def test_a_workspace_folder_that_is_a_file_is_refused_before_anything_is_claimed(
    cli: Cli, demo: Path, folder: str
) -> None:
    path = demo / folder
    if path.is_dir():
        path.rmdir()
    path.write_text("not a folder")
    done = cli("run", cwd=demo)
    assert done.returncode == 78, done.stdout + done.stderr
    assert f"{path} is not a folder" in done.stderr and done.stderr.count("\n") == 1
    assert len(list((demo / "inbox").iterdir())) == 6  # nothing claimed, nothing paid


def test_a_run_stopped_after_routing_says_so(cli: Cli, demo: Path) -> None:
    done = cli("run", cwd=demo, env={"STOP_AFTER": "route"})
    assert done.returncode == 2, done.stderr
    assert "[stop] stopped after route: 6 routed; no verdict in this run." in done.stdout
    status = cli("status", cwd=demo)
    assert "route" in status.stdout and "running" not in status.stdout


def test_a_node_left_open_by_a_stopped_run_shows_stopped(cli: Cli, demo: Path) -> None:
    """--timeout stops the run while it drafts: the fanout node never closed, and status
    shows it stopped, not running."""
    slow = variant(demo_scripts(), "T-1001#1", latency_ms=3000)
    write_scenarios(demo / "scenarios" / "demo.yaml", slow)
    done = cli("run", "--timeout", "1", cwd=demo)
    assert done.returncode == 2, done.stdout + done.stderr
    status = cli("status", cwd=demo)
    fanout = next(line for line in status.stdout.splitlines() if line.startswith("fanout"))
    assert "stopped" in fanout and "running" not in fanout, status.stdout


def test_a_tampered_run_json_is_one_line_naming_the_field(cli: Cli, demo: Path) -> None:
    assert cli("run", cwd=demo).returncode == 1
    meta = demo / "runs" / state(demo)["run_id"] / "run.json"
    meta.write_text(meta.read_text().replace('"status": "done"', '"status": "finished"'))
    for command in (["status"], ["resume", state(demo)["run_id"]]):
        done = cli(*command, cwd=demo)
        assert done.returncode == 3
        assert done.stderr.count("\n") == 1, done.stderr
        assert f"corrupt run state at {meta}: status: Input should be" in done.stderr


LOADING = """
import gc, json, sys
from orchestrator.cli.loading import loading as _loading
if sys.argv[1] == "off":
    gc.disable()
before = gc.get_stats()[0]["collections"]
with _loading():
    built = [[i] for i in range(100_000)]  # with collections on: about 140 young ones
    on_inside = gc.isenabled()
print(json.dumps({
    "on_inside": on_inside,
    "collections": gc.get_stats()[0]["collections"] - before,
    "on_after": gc.isenabled(),
    "frozen": gc.get_freeze_count(),
}))
"""


@pytest.mark.parametrize("before", ["on", "off"])
def test_a_command_loads_its_rooms_without_collecting_and_freezes_what_they_built(
    before: str,
) -> None:
    """`_loading` (around a command's imports): no collection inside, what was built is
    frozen after, and collections are back on only if they were on before."""
    done = subprocess.run(
        [sys.executable, "-c", LOADING, before], capture_output=True, text=True, check=True
    )
    seen = json.loads(done.stdout)
    assert seen["on_inside"] is False and seen["collections"] == 0
    assert seen["frozen"] >= 100_000
    assert seen["on_after"] is (before == "on")


def test_an_ordinary_mistake_is_one_sentence_without_a_traceback_or_celerys_log(
    demo: Path, cli: Cli
) -> None:
    """The workspace's scripts answer no router (a 400 from the scripted provider), then an
    endpoint that refuses connections, --quiet: each is one line on stderr, no traceback and
    no worker log line (those are in the run's workers.log, or on stderr with --log-level)."""
    scripts = [s for s in demo_scripts() if not s["name"].startswith("router")]
    write_scenarios(demo / "scenarios" / "demo.yaml", scripts)
    done = cli("run", cwd=demo)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "no script for the router's request" in done.stderr
    assert "ticketgraph scenarios init" in done.stderr
    run_id = state(demo)["run_id"]
    log = (demo / "runs" / run_id / "workers.log").read_text()
    assert "Traceback" in log  # kept for whoever looks, not shown to the one who ran it
    assert cli("requeue", run_id, cwd=demo).returncode == 0
    env = {"LLM_BASE_URL": f"http://127.0.0.1:{free_port()}/v1", "LLM_MAX_RETRIES": "0"}
    quiet = cli("run", "--quiet", cwd=demo, env=env)
    # 3 once claimed; 78 where the endpoint is checked before anything is claimed.
    assert quiet.returncode in (3, 78), quiet.stdout + quiet.stderr
    assert (quiet.stdout + quiet.stderr).count("\n") == 1, quiet.stdout + quiet.stderr
    for said in (done, quiet):
        assert "Traceback" not in said.stdout + said.stderr
        assert "/MainProcess]" not in said.stdout + said.stderr


def test_a_renamed_flag_still_works_with_a_note_and_is_gone_from_help(
    cli: Cli, tmp_path: Path
) -> None:
    """`cancel --wait SECONDS` became --wait-for-workers (`resume --wait` is a flag) and
    `worker -n` became --hostname alone (-n is `runs --limit`): the old spellings still
    reach the handler, with a note on stderr, and --help shows only the new ones."""
    from orchestrator.cli.main import cli as group

    for command, old, new, dest, value in (
        ("cancel", "--wait", "--wait-for-workers", "wait_for_workers", 3.0),
        ("worker", "-n", "--hostname", "hostname", "w1"),
    ):
        args = ["run-20260101-000000-ab12"] if command == "cancel" else []
        parsed = group.commands[command].make_context(command, [*args, old, str(value)])
        assert parsed.params[dest] == value
        done = cli(command, *args, old, str(value), cwd=tmp_path, env={"LLM_BASE_URL": ""})
        assert f"{old} is now {new}" in done.stderr, done.stderr
        assert done.returncode in (64, 78), done.stderr  # no workspace; no broker or model
        shown = cli(command, "--help", cwd=tmp_path).stdout
        assert new in shown and f"{old} " not in shown and f"{old}," not in shown


def test_a_failure_is_one_sentence_in_every_command_also_those_that_map_nothing(
    cli: Cli, tmp_path: Path
) -> None:
    """Failures are mapped to exit codes once, for every command: `init` into a folder
    under a file and `keys init` of a folder that is no workspace each say one sentence."""
    (tmp_path / "a-file").write_text("")
    made = cli("init", "a-file/ws", cwd=tmp_path)
    assert made.returncode == 3 and made.stderr.startswith("ticketgraph init: "), made.stderr
    keys = cli("keys", "init", "--workspace", "nowhere", cwd=tmp_path)
    assert keys.returncode == 64 and keys.stderr.startswith("ticketgraph keys init: no workspace")
    for said in (made, keys):
        assert said.stderr.count("\n") == 1 and "Traceback" not in said.stderr, said.stderr
