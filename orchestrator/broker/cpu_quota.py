"""The CPUs a process's cgroup may use: the quota `docker --cpus`, a Kubernetes CPU limit or
systemd's CPUQuota= sets, which neither `os.cpu_count` nor the CPU affinity shows.

cgroup v2 keeps it in `cpu.max` ("QUOTA PERIOD", or "max PERIOD"), v1 in `cpu.cfs_quota_us`
and `cpu.cfs_period_us`; a cgroup may not use more than any cgroup above it allows, so the
quota is the smallest on the way from the process's cgroup (`/proc/self/cgroup`) up.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# Where cgroup v1 mounts its cpu controller, by distribution; v2's files are in its root.
_V1_CPU = ("cpu", "cpu,cpuacct", "cpuacct,cpu")
_V2 = ("", "unified")


def of_this_process(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT
) -> float | None:
    """The CPUs this process's cgroup may use (quota / period, the smallest on its way up
    to the hierarchy's root), or None where no quota is set or there are no cgroups."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    found: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: "0::/path"
            found += _limits(root, _V2, path, _v2_limit)
        elif "cpu" in controllers.split(","):
            found += _limits(root, _V1_CPU, path, _v1_limit)
    return min(found) if found else None


def _limits(
    root: Path, mounts: tuple[str, ...], path: str, limit: Callable[[Path], float | None]
) -> list[float]:
    """The quota of every cgroup from `path` up to the mount's root, where one is set. In a
    container without its own cgroup namespace `path` names a host folder the container does
    not see: its mount then holds the container's cgroup itself."""
    found = []
    for mount in (root / m for m in mounts):
        if not mount.is_dir():
            continue
        folder = mount / path.lstrip("/")
        if not folder.is_dir():
            folder = mount
        for level in (folder, *folder.parents):
            if (cpus := limit(level)) is not None:
                found.append(cpus)
            if level == mount:
                break
    return found


def _v2_limit(folder: Path) -> float | None:
    """cpu.max: "QUOTA PERIOD" in µs, or "max PERIOD" for none."""
    try:
        quota, period = (folder / "cpu.max").read_text().split()
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _v1_limit(folder: Path) -> float | None:
    """cpu.cfs_quota_us (-1 for none) over cpu.cfs_period_us."""
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period
