"""Small caches the workflow keeps between Snakemake runs in ``.snakemake/``
(docs/caching-and-reruns.md, "What the workflow remembers between runs").

Each cache is one JSON file, read once per run and written whole through a rename (the last writer wins); past its
``limit`` the entries a run did not use go first; an entry whose digest does not match is a miss. Written by hand: a
database library would cost more to import than the caches save in a no-op rerun.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

MEMO_DIR = Path(".snakemake")  # Snakemake's own folder in the working directory; `make clean` removes it


class JsonMemo:
    """``{key: JSON value}`` remembered in ``.snakemake/<name>`` (a file that cannot be read: empty; one that cannot be
    written, a read-only working directory: left as it was)."""

    def __init__(self, name: str, limit: int | None = None):
        self.path = (MEMO_DIR / name).absolute()  # the working directory when the run began
        try:
            self.entries = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.entries = {}
        if not isinstance(self.entries, dict):
            self.entries = {}
        self.limit = limit
        self.used: set[str] = set()
        self.changed = False

    def get(self, key: str):
        entry = self.entries.get(key)
        if not (isinstance(entry, list) and len(entry) == 2 and entry[0] == _digest(key, entry[1])):
            return None
        self.used.add(key)
        return entry[1]

    def put(self, key: str, value) -> None:
        self.entries.pop(key, None)  # the newest last, so that the oldest go first
        self.entries[key] = [_digest(key, value), value]
        self.used.add(key)
        self.changed = True

    def save(self) -> None:
        if not self.changed:
            return
        if self.limit is not None and len(self.entries) > self.limit:
            unused = [key for key in self.entries if key not in self.used]
            for key in unused[: len(self.entries) - self.limit]:
                del self.entries[key]
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}")
        try:
            self.path.parent.mkdir(exist_ok=True)
            tmp.write_text(json.dumps(self.entries))
            os.replace(tmp, self.path)
        except OSError:  # computed again next time
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return
        self.changed = False


def _digest(key: str, value) -> str:
    return hashlib.sha256(json.dumps([key, value], sort_keys=True).encode()).hexdigest()[:16]
