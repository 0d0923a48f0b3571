"""What the benchmark scripts share: their common options, BBC training rows, and the JSONL record."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch

from kdpipe.core.device import pick_device, set_threads
from kdpipe.data.dataset import read_split
from kdpipe.data.prepare import prepare
from kdpipe.data.settings import DatasetSettings

BBC = {"name": "bbc", "source": "builtin:bbc_news", "split": {"validation": 0.1, "test": 0.2, "seed": 13}}
OUT = Path(__file__).parent / "out"


def parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--device", default=None, help="auto (default), cpu, cuda, cuda:N")
    return p


def setup(args) -> torch.device:
    set_threads(args.threads)
    return pick_device(args.device)


def bbc_train_rows(rows: int):
    """The first ``rows`` rows of BBC News' training split (kdpipe's default split)."""
    with tempfile.TemporaryDirectory() as tmp:
        prepare(DatasetSettings.of_section(BBC), Path(tmp) / "bbc")
        return read_split(Path(tmp) / "bbc", "train").head(rows)


def record(name: str, device: torch.device, **fields) -> dict:
    """Append a dated record of the machine and the numbers to ``out/{name}.jsonl`` and return it."""
    rec = {
        "date": date.today().isoformat(),
        "machine": platform.node(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        **fields,
    }
    OUT.mkdir(exist_ok=True)
    with open(OUT / f"{name}.jsonl", "a") as fh:
        fh.write(json.dumps(rec) + "\n")
    return rec


def timed_command(cmd: list[str], log: Path, threads: int, anon: dict | None = None) -> tuple[float, float]:
    """Wall seconds and peak resident MB of the command ``cmd`` under ``/usr/bin/time``, its output in ``log`` and
    ``OMP_NUM_THREADS=threads``; exits with the log's tail when it fails.

    The peak resident memory counts the pages of memory-mapped files the command touched (``RssFile``), which the
    kernel can drop at any time; with ``anon`` (a dict) the command's peak anonymous memory (``RssAnon``: its heap,
    what it cannot give back without freeing) is also sampled every 50 ms from /proc and stored as ``anon["mb"]``."""
    stats = log.with_suffix(".time")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with open(log, "w") as fh:
        proc = subprocess.Popen(["/usr/bin/time", "-f", "%e %M", "-o", str(stats), *cmd], stdout=fh, stderr=fh, env=env)
        peak_anon = 0
        while proc.poll() is None:
            if anon is not None:
                peak_anon = max(peak_anon, _anon_kb(proc.pid))
            time.sleep(0.05)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:6])} ... failed:\n{log.read_text()[-3000:]}")
    if anon is not None:
        anon["mb"] = peak_anon / 1024
    wall, kb = stats.read_text().split()[-2:]
    return float(wall), int(kb) / 1024


def _anon_kb(pid: int) -> int:
    """RssAnon (kB) of the children of ``pid`` (the command under /usr/bin/time), 0 when they are gone."""
    total = 0
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        for child in children:
            for line in Path(f"/proc/{child}/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    total += int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return total
