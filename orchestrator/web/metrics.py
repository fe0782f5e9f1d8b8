"""/metrics: ticketgraph's own records in Prometheus' text format, read from the run folders
at each scrape through the catalog (prometheus_client renders them).

No ticket id is ever a label. Per run (label `run_id`) only the runs that are live and the
newest RECENT_RUNS others are exported, so the number of series stays bounded however many
runs the workspace keeps; the workspace totals count every run.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from orchestrator.run.records import TicketStatus
from orchestrator.web.catalog import RunRow

RECENT_RUNS = 20
VERDICTS = ("running", "all_pass", "needs_human", "stopped", "crashed")
ENDED = {TicketStatus.PASS.value, TicketStatus.NEEDS_HUMAN.value}


class RunsCollector(Collector):
    """The collector of one workspace's runs (`rows` gives them, newest first)."""

    def __init__(self, rows: object) -> None:
        self._rows = rows

    def collect(self) -> Iterator[Metric]:
        rows: list[RunRow] = self._rows()  # type: ignore[operator]
        runs = GaugeMetricFamily(
            "ticketgraph_runs", "Runs in the workspace, by verdict", labels=["verdict"]
        )
        counts = {v: 0 for v in VERDICTS}
        for row in rows:
            counts[row.verdict] = counts.get(row.verdict, 0) + 1
        for verdict, count in counts.items():
            runs.add_metric([verdict], count)
        yield runs

        tickets = GaugeMetricFamily(
            "ticketgraph_tickets", "Tickets of every run, by status", labels=["status"]
        )
        by_status = {s.value: 0 for s in TicketStatus}
        for row in rows:
            for status, count in row.by_status.items():
                by_status[status] = by_status.get(status, 0) + count
        for status, count in by_status.items():
            tickets.add_metric([status], count)
        yield tickets

        yield _counter(
            "ticketgraph_model_calls", "Model calls, every run", sum(r.calls for r in rows)
        )
        yield _counter("ticketgraph_tokens", "Tokens, every run", sum(r.tokens for r in rows))
        yield _counter(
            "ticketgraph_cost_usd", "USD spent, every run", round(sum(r.cost_usd for r in rows), 8)
        )
        yield _gauge(
            "ticketgraph_awaiting_approval",
            "Tickets whose worker waits for a person's decision",
            sum(r.waiting for r in rows),
        )
        in_flight = sum(n for r in rows if r.live for s, n in r.by_status.items() if s not in ENDED)
        yield _gauge(
            "ticketgraph_tickets_in_flight", "Tickets of live runs that have not ended", in_flight
        )

        shown = [r for r in rows if r.live] + [r for r in rows if not r.live][:RECENT_RUNS]
        per_run = {
            "ticketgraph_run_tickets": ("Tickets of the run", lambda r: r.tickets),
            "ticketgraph_run_need_a_human": (
                "Tickets of the run that need a human",
                lambda r: r.need_a_human,
            ),
            "ticketgraph_run_model_calls": ("Model calls of the run", lambda r: r.calls),
            "ticketgraph_run_tokens": ("Tokens of the run", lambda r: r.tokens),
            "ticketgraph_run_cost_usd": ("USD the run spent", lambda r: r.cost_usd),
            "ticketgraph_run_live": ("1 while the run works", lambda r: int(r.live)),
        }
        for name, (text, value) in per_run.items():
            family = GaugeMetricFamily(name, text, labels=["run_id", "verdict"])
            for row in shown:
                family.add_metric([row.run_id, row.verdict], value(row))
            yield family


def registry(rows: object) -> CollectorRegistry:
    """A registry holding only the workspace's collector (no process metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunsCollector(rows))
    return registry


def _counter(name: str, text: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, text)
    family.add_metric([], value)
    return family


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, text)
    family.add_metric([], value)
    return family
