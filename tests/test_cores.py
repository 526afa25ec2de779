"""The cores a process may use (CPU affinity, cgroup CPU quota) and the decoder threads they give."""

from __future__ import annotations

import bz2
import gzip
import io
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, Dict, List

import pytest

import ratarmountcore
from ratarmountcore import cores
from ratarmountcore.options import CompressionOptions, IndexOptions, OpenOptions


def _tree(root: Path, files: Dict[str, str]) -> str:
    for name, text in files.items():
        path = root / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


def _mountinfo(*lines: str) -> str:
    base = "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
    return base + "".join(line + "\n" for line in lines)


def test_cgroup_v2_quota_is_the_smallest_along_the_ancestors(tmp_path: Path) -> None:
    """A Slurm step or a Kubernetes container below a limited job: the limit above applies."""
    root = _tree(
        tmp_path,
        {
            "proc/self/cgroup": "0::/job/step\n",
            "proc/self/mountinfo": _mountinfo("30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate"),
            "sys/fs/cgroup/cpu.max": "max 100000\n",
            "sys/fs/cgroup/job/cpu.max": "250000 100000\n",
            "sys/fs/cgroup/job/step/cpu.max": "max 100000\n",
        },
    )
    assert cores.cgroup_cpu_limit(root) == 2.5
    (tmp_path / "sys/fs/cgroup/job/step/cpu.max").write_text("150000 100000\n")
    assert cores.cgroup_cpu_limit(root) == 1.5


def test_cgroup_v1_cfs_quota(tmp_path: Path) -> None:
    files = {
        "proc/self/cgroup": "4:memory:/slurm/job_7\n3:cpu,cpuacct:/slurm/job_7\n1:name=systemd:/\n",
        "proc/self/mountinfo": _mountinfo(
            "31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct",
            "32 25 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory",
        ),
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "sys/fs/cgroup/cpu,cpuacct/slurm/job_7/cpu.cfs_quota_us": "400000\n",
        "sys/fs/cgroup/cpu,cpuacct/slurm/job_7/cpu.cfs_period_us": "100000\n",
    }
    root = _tree(tmp_path, files)
    assert cores.cgroup_cpu_limit(root) == 4.0
    (tmp_path / "sys/fs/cgroup/cpu,cpuacct/slurm/job_7/cpu.cfs_quota_us").write_text("-1\n")
    assert cores.cgroup_cpu_limit(root) is None


def test_a_container_sees_its_own_cgroup_at_the_mount_root(tmp_path: Path) -> None:
    """Without a cgroup namespace the container's cgroup is bind-mounted as the hierarchy's root:
    the path /proc names lies above the mount, and the limit is read at the mount point."""
    root = _tree(
        tmp_path,
        {
            "proc/self/cgroup": "0::/docker/abc\n",
            "proc/self/mountinfo": _mountinfo("30 1 0:26 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw"),
            "sys/fs/cgroup/cpu.max": "300000 100000\n",
        },
    )
    assert cores.cgroup_cpu_limit(root) == 3.0


@pytest.mark.parametrize(
    "files",
    [
        {},
        {"proc/self/cgroup": "0::/\n", "proc/self/mountinfo": "garbage\n"},
        {
            "proc/self/cgroup": "0::/\n",
            "proc/self/mountinfo": _mountinfo("30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw"),
            "sys/fs/cgroup/cpu.max": "lots 100000\n",
        },
        {
            "proc/self/cgroup": "0::/../../x\n",
            "proc/self/mountinfo": _mountinfo("30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw"),
            "sys/fs/cgroup/cpu.max": "0 100000\n",
        },
    ],
)
def test_no_or_unreadable_quota_means_none(tmp_path: Path, files: Dict[str, str]) -> None:
    assert cores.cgroup_cpu_limit(_tree(tmp_path, files)) is None


def test_usable_cores_are_the_fewer_of_affinity_and_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    cores.usable_cores.cache_clear()
    try:
        monkeypatch.setattr(cores, "affinity_cores", lambda: 64)
        monkeypatch.setattr(cores, "cgroup_cpu_limit", lambda root="/": 2.5)
        assert cores.usable_cores() == 3
        cores.usable_cores.cache_clear()
        monkeypatch.setattr(cores, "cgroup_cpu_limit", lambda root="/": 0.2)
        assert cores.usable_cores() == 1
        cores.usable_cores.cache_clear()
        monkeypatch.setattr(cores, "cgroup_cpu_limit", lambda root="/": None)
        assert cores.usable_cores() == 64
    finally:
        cores.usable_cores.cache_clear()


def test_default_decoder_threads_are_capped_and_an_explicit_count_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cores, "usable_cores", lambda: 96)
    assert CompressionOptions().threads() == cores.DEFAULT_DECODER_THREADS == 16
    assert CompressionOptions(parallelization=96).threads() == 96
    monkeypatch.setattr(cores, "usable_cores", lambda: 3)
    assert CompressionOptions().threads() == 3


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to confine the process to one")
def test_a_process_confined_to_one_cpu_decodes_with_one_thread() -> None:
    """As a batch job's cpuset does: the node's core count is not what the job may use."""
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from ratarmountcore.options import CompressionOptions; print(CompressionOptions().threads())"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "1"


@pytest.mark.parametrize("codec", ["bz2", "gz"])
def test_decoders_on_a_large_node_get_at_most_the_default_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: str
) -> None:
    """Each decoder thread holds decoded data of its own (memory grows with them): a 64-core
    node does not give a decoder 64 threads (128 for gzip's two per core) unless -P says so.
    Counted where rapidgzip is asked for them, and in /proc while the decoders are open."""
    import rapidgzip

    rng = random.Random(3)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(200):
            data = rng.randbytes(20_000).hex().encode()
            info = tarfile.TarInfo(f"f{i}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    archive = tmp_path / f"a.tar.{codec}"
    archive.write_bytes(bz2.compress(buf.getvalue(), 1) if codec == "bz2" else gzip.compress(buf.getvalue(), 1))
    asked: List[int] = []
    name = "IndexedBzip2File" if codec == "bz2" else "RapidgzipFile"
    library = getattr(rapidgzip, name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs["parallelization"])
        return library(*args, **kwargs)

    monkeypatch.setattr(rapidgzip, name, recording)
    monkeypatch.setattr(cores, "usable_cores", lambda: 64)
    spacing = 64 << 10 if codec == "gz" else None  # (a decoder gets no more threads than chunks)

    def open_and_read(parallelization: int, recreate: bool) -> int:
        asked.clear()
        options = OpenOptions(
            index=IndexOptions(index_folders=(str(tmp_path),), recreate=recreate, progress=False),
            compression=CompressionOptions(
                gzip_backend="rapidgzip", parallelization=parallelization, seek_point_spacing=spacing
            ),
        )
        with ratarmountcore.open(str(archive), options) as src:
            assert all(src.read(f"/f{i}") == src.read(f"/f{i}") for i in range(0, 200, 7))
            if codec == "gz":  # (small reads decode from seek points in this process)
                with src.open("/f0") as f:
                    f.read()
            return len(os.listdir("/proc/self/task"))

    before = len(os.listdir("/proc/self/task"))
    open_and_read(0, recreate=True)
    assert asked and max(asked) <= cores.DEFAULT_DECODER_THREADS, asked
    tasks = open_and_read(0, recreate=False)
    assert max(asked, default=0) <= cores.DEFAULT_DECODER_THREADS
    assert tasks - before <= len(asked) * cores.DEFAULT_DECODER_THREADS + 2
    open_and_read(64, recreate=True)
    assert 64 in asked
