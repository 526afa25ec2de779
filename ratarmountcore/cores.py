"""The cores this process may use, by which decoder and worker threads are sized.

``os.cpu_count()`` counts the node's cores. A batch job is usually confined to some of them: by
a cpuset (Slurm, PBS; the process's CPU affinity) or by a CPU quota of its cgroup (Docker's
``--cpus``, Kubernetes' limits). Threads sized by the node's count there thrash on the cores the
job has, and every decoder thread holds decoded chunks of its own, so memory grows with their
number until the job's memory limit ends it: a job given 4 cores of a 128-core node started 256
gzip decoder threads. Here the cores a process may use are the fewer of its affinity and its
cgroup quota (rounded up), and decoders use at most ``DEFAULT_DECODER_THREADS`` unless told
otherwise (``-P``).
"""

from __future__ import annotations

import functools
import logging
import math
import os
from typing import Dict, List, Optional

from .io.mountinfo import mounts, read_mountinfo

logger = logging.getLogger(__name__)

#: Decoder threads when ``-P`` is not given, at most. Memory grows with the threads, the more
#: so the better the data compresses: a first mount's decoding child peaked at 99, 229 and 583
#: MiB with 2, 16 and 64 threads for the 100,000-file benchmark .tar.gz (1.8:1), at 36 and 449
#: MiB with 2 and 16 for a 327 MB tar of text compressing 38:1. Sixteen already decode gzip
#: faster than a FUSE mount hands the data on.
DEFAULT_DECODER_THREADS = 16


def affinity_cores() -> int:
    """The cores the scheduler lets this process run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # (not Linux)
        return os.cpu_count() or 1


def _read(path: str) -> Optional[str]:
    try:
        # (UTF-8, whose codec every interpreter has loaded: "ascii" imported its module on the
        # first mount, which fails where the interpreter's files cannot be read, as for a test's
        # process that became "nobody".)
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _levels(point: str, mount_root: str, path: str) -> List[str]:
    """The folders of cgroup ``path`` under a mount of the hierarchy at ``point``, from the
    process's own cgroup up to the mount's root (a limit anywhere above applies too)."""
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root.rstrip("/") + "/")):
        path = path[len(mount_root) :]
    elif mount_root != "/":  # (a container sees its own cgroup as the root)
        path = "/"
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    return [os.path.join(point, *parts[:depth]) for depth in range(len(parts), -1, -1)]


def _v2_limit(folder: str) -> Optional[float]:
    text = _read(os.path.join(folder, "cpu.max"))
    if not text:
        return None
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_limit(folder: str) -> Optional[float]:
    quota, period = _read(os.path.join(folder, "cpu.cfs_quota_us")), _read(os.path.join(folder, "cpu.cfs_period_us"))
    try:
        q, p = int(quota or ""), int(period or "")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def cgroup_cpu_limit(root: str = "/") -> Optional[float]:
    """The CPU quota of this process's cgroup (in cores, the smallest along its ancestors), or
    None when there is none or it cannot be read. ``root``: where ``/proc`` and the cgroup
    mounts are found (tests pass a tree of their own)."""
    cgroup = _read(os.path.join(root, "proc/self/cgroup"))
    mountinfo = read_mountinfo(root)
    if not cgroup or not mountinfo:
        return None
    v1_paths: Dict[str, str] = {}
    v2_path: Optional[str] = None
    for line in cgroup.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and not controllers:
            v2_path = path
        else:
            for controller in controllers.split(","):
                v1_paths[controller] = path
    limits: List[float] = []
    for mount in mounts(mountinfo):
        if mount.kind == "cgroup2" and v2_path is not None:
            found = (_v2_limit(root + folder) for folder in _levels(mount.point, mount.root, v2_path))
        elif mount.kind == "cgroup" and "cpu" in mount.super_options and "cpu" in v1_paths:
            found = (_v1_limit(root + folder) for folder in _levels(mount.point, mount.root, v1_paths["cpu"]))
        else:
            continue
        limits.extend(limit for limit in found if limit is not None)
    return min(limits) if limits else None


@functools.cache
def usable_cores() -> int:
    """The cores this process may use: its affinity, or fewer by its cgroup's CPU quota."""
    cores = affinity_cores()
    limit = cgroup_cpu_limit()
    if limit is not None and math.ceil(limit) < cores:
        logger.debug("CPU quota of %.2f cores: using %d of %d", limit, math.ceil(limit), cores)
        cores = max(1, math.ceil(limit))
    return cores


def default_decoder_threads() -> int:
    """Decoder threads when ``-P`` is not given: the usable cores, at most 16."""
    return min(usable_cores(), DEFAULT_DECODER_THREADS)


def describe() -> str:
    """One line for ``--version``: the cores found and the decoder threads they give."""
    limit = cgroup_cpu_limit()
    quota = "none" if limit is None else f"{limit:g} cores"
    return (
        f"cores: {usable_cores()} usable (CPU affinity {affinity_cores()}, cgroup CPU quota {quota}); "
        f"decoder threads without -P: {default_decoder_threads()}"
    )
