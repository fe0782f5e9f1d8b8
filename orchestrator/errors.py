"""Errors of the graph, raised on purpose and reported with exit code 3 by the CLI.

GraphError
├── InboxError        a ticket file cannot be read or is malformed
├── RunStateError     a run folder or its run-state.json is missing or corrupt
├── BrokerError       the broker cannot be reached, or the embedded one started
│   ├── BrokerUnavailable  the broker stayed away longer than the outage window (exit 75)
│   └── BrokerLostRun      the broker came back without the run's queued work (exit 2)
├── RunStorageError   the run folder or out/ cannot be written (a crash, exit 3)
├── RouteFailed       the router's model run did not answer
├── RunTimeout        the verdict did not arrive in time
├── ClaimStranded     a run's claim of inbox/ did not finish: its files wait in its folder
├── RunBusy           another process holds the run's lease (exit 75: try again later)
├── ConfigError       the workspace or environment configuration is wrong (exit 78)
└── UsageError        the command line names something that is not there (exit 64)
"""

from __future__ import annotations


class GraphError(Exception):
    """Base of the graph's own errors."""


class InboxError(GraphError):
    """A ticket in the inbox is unreadable or malformed."""


class RunStateError(GraphError):
    """A run's folder or state is missing or cannot be parsed."""


class BrokerError(GraphError):
    """The broker failed, or the embedded one could not start."""


class BrokerUnavailable(BrokerError):
    """The broker stayed unreachable for the whole outage window."""


class BrokerLostRun(BrokerError):
    """The broker restarted without persistence: the run's messages and keys are gone."""


class RunStorageError(GraphError):
    """The run's files cannot be written: read-only, disk full, gone."""


class RouteFailed(GraphError):
    """The router's model run did not complete; the run cannot go on."""


class RunTimeout(GraphError):
    """The run did not finish within the configured time."""


class ClaimStranded(GraphError):
    """A run's claim of inbox/ did not finish (this run's, or an earlier one no process
    holds): its files wait in runs/<run>/claimed/ for `resume` or `requeue`."""


class RunBusy(GraphError):
    """Another live process holds the run's lease."""


class ConfigError(GraphError):
    """A configuration value is missing, unknown or out of range."""


class UsageError(GraphError):
    """The command line is wrong: an unknown run id, a missing workspace."""
