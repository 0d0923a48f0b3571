"""Resume checkpoints of the training loop, and the work folder beside a job's output that holds them.

The resume folder and the JSONL training log live beside the output, outside it (Snakemake deletes declared outputs
before a rerun). A checkpoint records its files' checksums and the identity of the job that made it, so that a
damaged one or one of another job is discarded, never resumed.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from kdpipe.core.checksums import checksum
from kdpipe.core.finished import keep_finished, work_dir
from kdpipe.core.identity import what_changed
from kdpipe.core.store import ArtifactError, atomic_path, ensure_disk_space, read_json, write_json
from kdpipe.training import distributed

FREE_SPACE = "free space on that disk (or set checkpoint_every: 0 to checkpoint only at epoch ends)"


class Checkpoint:
    """The resume directory: numbered checkpoint folders and a ``LATEST`` pointer, switched atomically to a new
    complete one before older ones are removed: a kill at any moment leaves ``LATEST`` naming a complete one."""

    def __init__(self, root: Path | None, key: str):
        self.root, self.key = (Path(root) if root else None), key
        self.count = 0

    def current(self) -> Path | None:
        pointer = self.root / "LATEST" if self.root else None
        if pointer is None or not pointer.exists():
            return None
        return self.root / pointer.read_text().strip()

    def load(self) -> dict | None:
        """The state of the latest checkpoint, or None (and the folder cleared, with a log line) when there is none,
        it was made by a job of another identity, or a file of it is damaged."""
        try:
            current = self.current()
            if current is None:
                return None
            state = read_json(current / "state.json")
            if state.get("resume_key") != self.key:
                why = what_changed(str(state.get("resume_key")), self.key)
                say(f"[kdpipe] {self.root}: a checkpoint made from {why}; discarded, training starts from scratch")
                self.clear()  # never resume from it
                return None
            damaged = [
                name for name, digest in (state.get("checksums") or {}).items() if checksum(current / name) != digest
            ]
            if damaged or not state.get("checksums"):
                raise ArtifactError(f"{', '.join(damaged) or 'its checksums'}: missing or changed since written")
            self.count = int(current.name.split("-")[1])
            return state
        except (ArtifactError, OSError, ValueError, IndexError) as err:
            say(f"[kdpipe] {self.root}: the checkpoint is damaged ({err}); discarded, training starts from scratch")
            self.clear()
            return None

    def save(self, state: dict, tensors: dict[str, dict], optimizer, scheduler, extra: dict | None = None) -> None:
        rng = distributed.gather(torch.get_rng_state())  # every process's (dropout masks differ by process)
        if self.root is None or not distributed.is_main():
            return
        self.count += 1
        folder = self.root / f"ckpt-{self.count:06d}"
        weights = sum(t.numel() * t.element_size() for sd in tensors.values() for t in sd.values())
        # AdamW keeps two moments per weight: the checkpoint holds about three times the weights
        ensure_disk_space(folder, 3 * weights, "a resume checkpoint", hint=FREE_SPACE)
        with atomic_path(folder, directory=True) as tmp:
            for name, sd in tensors.items():
                # tied weights share storage; safetensors refuses shared tensors, so store independent copies
                save_file({k: v.clone().contiguous() for k, v in sd.items()}, str(tmp / f"{name}.safetensors"))
            torch.save(
                {
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "torch_rngs": rng,
                    "extra": extra,
                },
                tmp / "optim.pt",
            )
            sums = {path.name: checksum(path) for path in sorted(tmp.iterdir())}
            write_json(tmp / "state.json", {**state, "resume_key": self.key, "checksums": sums})
        with atomic_path(self.root / "LATEST") as tmp:
            tmp.write_text(folder.name)
        for old in self.root.glob("ckpt-*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)

    def tensors(self, name: str) -> dict:
        return load_file(str(self.current() / f"{name}.safetensors"))

    def optim(self) -> dict:
        return torch.load(self.current() / "optim.pt", weights_only=True)

    def clear(self) -> None:
        if self.root is not None and self.root.exists():
            shutil.rmtree(self.root)


def best_entry(name: str) -> str:
    """The checkpoint entry of a module's best state."""
    return "best" if name == "model" else f"best.{name}"


def work_paths(out_dir: Path) -> tuple[Path, Path]:
    """The resume directory and the JSONL training log of the job writing ``out_dir``, beside it."""
    out_dir = Path(out_dir)
    work = work_dir(out_dir)
    work.mkdir(parents=True, exist_ok=True)
    return work / out_dir.name, work / f"{out_dir.name}.train_log.jsonl"


def finish(out_tmp: Path, out_dir: Path) -> None:
    """Keep a copy of the finished (temporary) output dir for a rerun to restore
    (:func:`kdpipe.core.finished.restore_finished`), and drop the resume state."""
    resume, _ = work_paths(out_dir)
    keep_finished(out_tmp, Path(out_dir))
    Checkpoint(resume, "").clear()


def rewind_log(path: Path, size: int | None) -> None:
    """Cut the training log back to ``size`` bytes, its length at the checkpoint a run resumes from, so that the
    records the resumed steps write again do not appear twice (nothing when ``size`` is None)."""
    if size is not None and path.is_file() and path.stat().st_size > size:
        with open(path, "r+") as fh:
            fh.truncate(size)


def say(message: str) -> None:
    """A line on stderr, from the first process only."""
    if distributed.is_main():
        print(message, file=sys.stderr)
