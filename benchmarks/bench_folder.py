#!/usr/bin/env python3
"""Benchmark a folder of class tars mounted with ``-r``: ImageNet's training set as users hold it
once the outer tar is unpacked (``train/n01440764.tar``, ... each holding its class's JPEGs).

    python benchmarks/bench_folder.py --classes 1000 --files-per-class 100 --out benchmarks/results/folder.json

Per tool (ours, and the PyPI ratarmount release as the peer, both ``-r FOLDER MOUNTPOINT``):
first mount (no index anywhere), second mount (median of 3), a mount with ``--lazy`` (archives
opened when first used), ``find | wc -l`` over everything, 1,000 random reads after dropping the
page cache, and the mount process's peak RSS. Every figure is checked (file count, bytes read).
The measurement machinery is bench_tar.py's.

With ``--gzip`` each class archive is a ``.tar.gz`` (``gzip -6`` of the same tar; the data,
random bytes, compresses about as little as JPEGs do): reads through many small compressed
streams that share one decoded-data cache.

With ``--union`` the same tars are mounted together instead (``ratarmount A.tar B.tar ...
MOUNTPOINT``, no ``-r``): 100,000 files in one folder, the shape of a WebDataset's shards
mounted at one place (no lazy mount then).

With ``--outer tar`` (or ``--outer gz``, ``--outer zst``) the class archives are packed into
one tar (or .tar.gz, or .tar.zst of one frame) first, mounted with ``-r``: ImageNet's
``ILSVRC2012_img_train.tar`` as it is downloaded, 1,000 class tars in one tar (no lazy mount
then either).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import io
import json
import os
import platform
import random
import statistics
import sys
import tarfile
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_tar as bt  # noqa: E402


class FolderDataset:
    """``classes`` tars of ``files`` members each (1-4 KiB, contents a function of the seed)."""

    def __init__(self, classes: int, files: int, seed: int, gzipped: bool = False) -> None:
        self.classes, self.per_class, self.seed = classes, files, seed
        self.gzipped = gzipped
        #: The class archives' extension.
        self.suffix = ".tar.gz" if gzipped else ".tar"
        self.folder = os.path.join(bt.WORK, "data", f"folder-{classes}x{files}" + ("-gz" if gzipped else ""))
        self.wnids = [f"n{1440764 + 1637 * c:08d}" for c in range(classes)]
        self.paths = [f"{w}{self.suffix}/{w}_{10000 + 7 * i}.JPEG" for w in self.wnids for i in range(files)]
        self.files = len(self.paths)

    def content(self, i: int) -> bytes:
        rng = random.Random(self.seed * 1_000_003 + i)
        head = self.paths[i].encode() + b"\n"
        return head + rng.randbytes(rng.randint(1024, 4096) - len(head))

    def ensure(self) -> None:
        marker = os.path.join(self.folder, ".complete")
        if os.path.exists(marker):
            return
        os.makedirs(self.folder, exist_ok=True)
        for c, wnid in enumerate(self.wnids):
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
                for i in range(c * self.per_class, (c + 1) * self.per_class):
                    data = self.content(i)
                    info = tarfile.TarInfo(self.paths[i].split("/", 1)[1])
                    info.size, info.mtime, info.mode = len(data), 1_600_000_000, 0o644
                    tar.addfile(info, io.BytesIO(data))
            with open(os.path.join(self.folder, f"{wnid}{self.suffix}"), "wb") as f:
                f.write(gzip.compress(buffer.getvalue(), 6, mtime=0) if self.gzipped else buffer.getvalue())
        open(marker, "w").close()

    def outer(self, kind: str) -> str:
        """The class archives packed into one tar (``kind`` "tar") or .tar.gz ("gz"), made if
        missing; its members are named as the class archives, so paths in the mount are alike."""
        path = self.folder + {"tar": ".outer.tar", "gz": ".outer.tar.gz", "zst": ".outer.tar.zst"}[kind]
        if os.path.exists(path):
            return path
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for wnid in self.wnids:
                tar.add(os.path.join(self.folder, wnid + self.suffix), arcname=wnid + self.suffix)
        data = buffer.getvalue()
        with open(path + ".tmp", "wb") as f:
            if kind == "zst":  # one frame, as ``tar -I zstd`` or ``zstd -T0`` write it
                import zstandard

                f.write(zstandard.ZstdCompressor(level=3).compress(data))
            else:
                f.write(data if kind == "tar" else gzip.compress(data, 6, mtime=0))
        os.rename(path + ".tmp", path)
        return path


class FolderTool(bt.Tool):
    """A tool given the folder (its own hard-linked copy: indexes beside the tars never collide)."""

    lazy_flag = "--lazy"

    def __init__(self, ds: FolderDataset, args: argparse.Namespace, executable: str, name: str) -> None:
        self.name = name
        self.ds_folder = ds
        self.args = args
        self.folder = os.path.join(bt.WORK, "run", os.path.basename(ds.folder), name)
        self.mountpoint = os.path.join(self.folder, "mnt")
        self.outer = ds.outer(args.outer) if args.outer else ""
        self.archive = os.path.join(self.folder, "train" + self.outer[len(ds.folder) + len(".outer") :])
        self._executable = executable
        self.lazy = False

    def prepare(self) -> None:
        os.makedirs(self.folder if self.outer else self.archive, exist_ok=True)
        if bt.is_mounted(self.mountpoint):
            bt.unmount(self.mountpoint, bt.fuse_daemon_pid(self.mountpoint))
        os.makedirs(self.mountpoint, exist_ok=True)
        if self.outer:
            if not os.path.exists(self.archive):
                os.link(self.outer, self.archive)
            return
        for wnid in self.ds_folder.wnids:
            name = wnid + self.ds_folder.suffix
            target = os.path.join(self.archive, name)
            if not os.path.exists(target):
                os.link(os.path.join(self.ds_folder.folder, name), target)

    def index_files(self) -> List[str]:
        return [
            os.path.join(self.archive if not self.outer else self.folder, "*.index.sqlite"),
            os.path.expanduser("~/.cache/ratarmount/n*.tar.*.index.sqlite"),
            os.path.expanduser("~/.ratarmount/*train*"),
        ]

    def mount_command(self) -> List[str]:
        if self.args.union:
            tars = sorted(glob.glob(os.path.join(self.archive, "*" + self.ds_folder.suffix)))
            return [self._executable, *tars, self.mountpoint]
        return [self._executable, "-r", *([self.lazy_flag] if self.lazy else []), self.archive, self.mountpoint]

    def shown(self, path: str) -> str:
        """A member's path in the mount (a union shows the members of all tars in one folder)."""
        return path.split("/", 1)[1] if self.args.union else path

    def version(self) -> str:
        return bt.command_output([self._executable, "--version"]).splitlines()[0]


def read_random(tool: "FolderTool", ds: FolderDataset, indices: List[int]) -> float:
    start = time.perf_counter()
    data = []
    for i in indices:
        with open(os.path.join(tool.mountpoint, tool.shown(ds.paths[i])), "rb") as f:
            data.append(f.read())
    seconds = time.perf_counter() - start
    for i, got in zip(indices, data):
        if got != ds.content(i):
            raise bt.InvalidResultError(f"{ds.paths[i]}: wrong bytes")
    return seconds


def bench(tool: FolderTool, ds: FolderDataset, args: argparse.Namespace) -> Dict[str, Any]:
    row: Dict[str, Any] = {"tool": tool.name, "version": tool.version(), "errors": []}
    tool.prepare()
    indices = random.Random(ds.seed + 1).sample(range(ds.files), min(args.random_reads, ds.files))

    def session(measure_rss: bool = False) -> bt.MountResult:
        bt.wait_for_quiet(f"{tool.name} mount", args.quiet_wait)
        return tool.mount(args.mount_timeout, measure_rss=measure_rss)

    try:
        tool.remove_index()
        for path in [tool.archive] if tool.outer else glob.glob(os.path.join(tool.archive, "*" + ds.suffix)):
            bt.warm_file(path)
        mounted = session(measure_rss=True)
        row["first_mount_s"] = mounted.seconds
        row["first_mount_peak_rss_kib"] = max(
            bt.proc_status(mounted.pid)["VmHWM"] if mounted.pid else 0, mounted.command_maxrss_kib
        )
        bt.unmount(tool.mountpoint, mounted.pid)
        row["index_files"] = sum(len(glob.glob(p)) for p in tool.index_files())
        times = []
        for _ in range(3):
            mounted = session()
            times.append(mounted.seconds)
            bt.unmount(tool.mountpoint, mounted.pid)
        row["second_mount_s"] = statistics.median(times)
        if not args.union and not args.outer:
            tool.lazy = True
            mounted = session()
            row["lazy_mount_s"] = mounted.seconds
            tool.lazy = False
            bt.unmount(tool.mountpoint, mounted.pid)
        mounted = session()
        # (The peer shows the index files it writes for inner .tar.gz as files of the mount.)
        row["find_s"] = bt.measure_find(tool.mountpoint, ds.files, args.phase_timeout, exclude="*.index.sqlite")
        bt.wait_for_quiet(f"{tool.name} random reads", args.quiet_wait)
        bt.drop_caches(3)
        row["random_reads_s"] = read_random(tool, ds, indices)
        if mounted.pid:
            row["peak_rss_kib"] = max(bt.proc_status(mounted.pid)["VmHWM"], row["first_mount_peak_rss_kib"])
        bt.unmount(tool.mountpoint, mounted.pid)
    except (RuntimeError, OSError, bt.InvalidResultError) as exc:
        row["errors"].append(str(exc))
        bt.log(f"  {tool.name} FAILED: {exc}")
        if bt.is_mounted(tool.mountpoint):
            bt.unmount(tool.mountpoint, bt.fuse_daemon_pid(tool.mountpoint))
    finally:
        tool.remove_index()
    bt.log(f"  {tool.name}: " + ", ".join(f"{k} {v}" for k, v in row.items() if k.endswith(("_s", "_kib"))))
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--files-per-class", type=int, default=100)
    parser.add_argument("--random-reads", type=int, default=1000)
    parser.add_argument("--tools", default="ours,peer")
    parser.add_argument("--union", action="store_true", help="mount the tars together (no -r) instead of the folder")
    parser.add_argument("--gzip", action="store_true", help="class archives as .tar.gz instead of .tar")
    parser.add_argument(
        "--outer",
        choices=["tar", "gz", "zst"],
        help="the class archives packed into one tar, .tar.gz or .tar.zst (one frame), mounted with -r",
    )
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--mount-timeout", type=float, default=600)
    parser.add_argument("--phase-timeout", type=float, default=300)
    parser.add_argument("--quiet-wait", type=float, default=10)
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument(
        "--ours-cmd", help="our ratarmount command (default: this checkout installed into benchmarks/work/ours-venv)"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_folder.py: needs root (drop_caches, FUSE)", file=sys.stderr)
        return 2
    ds = FolderDataset(args.classes, args.files_per_class, args.seed, args.gzip)
    ds.ensure()
    # Installed as users install it and as the peer is (not editable), like bench_tar.py does.
    ours = args.ours_cmd or (
        os.path.join(bt.install_ours(bt.REPO, bt.OURS_VENV), "ratarmount") if "ours" in args.tools.split(",") else ""
    )
    executables = {"ours": ours, "peer": os.path.join(bt.PEER_VENV, "bin", "ratarmount")}
    rows = []
    for name in args.tools.split(","):
        if not os.path.exists(executables[name]):
            bt.log(f"skipping {name}: {executables[name]} missing (benchmarks/setup_peers.sh)")
            continue
        bt.log(f"{name}: {ds.classes} class tars of {ds.per_class} files")
        rows.append(bench(FolderTool(ds, args, executables[name], name), ds, args))
    mode = "folder with -r"
    if args.union:
        mode = "union of the tars"
    elif args.outer:
        mode = f"the tars in one {'tar' if args.outer == 'tar' else '.tar.' + args.outer}, with -r"
    result: Dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
        "dataset": {"classes": ds.classes, "files_per_class": ds.per_class, "files": ds.files, "gzip": ds.gzipped},
        "mode": mode,
        "rows": rows,
    }
    by_tool = {row["tool"]: row for row in rows}
    if "ours" in by_tool and "peer" in by_tool:
        ratios: Dict[str, Optional[float]] = {}
        for key in ("first_mount_s", "second_mount_s", "lazy_mount_s", "find_s", "random_reads_s", "peak_rss_kib"):
            a, b = by_tool["ours"].get(key), by_tool["peer"].get(key)
            ratios[key] = round(a / b, 3) if a and b else None
        result["ours_over_peer"] = ratios
        bt.log("ours / peer: " + ", ".join(f"{k} {v}" for k, v in ratios.items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        bt.log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
