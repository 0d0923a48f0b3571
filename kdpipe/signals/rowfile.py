"""Rows of a large ``.npy`` file written and read with plain file I/O (``os.pwrite``, ``readinto``).

Through a memory map every page touched stays mapped into the process, so its memory grows with the file; plain
file I/O keeps a pass's memory flat in N (benchmarks/RESULTS.md, "How cost grows with the work"). The file is a
standard ``.npy``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

CHUNK_BYTES = 64 << 20  # rows copied at a time by a gather


class RowFile:
    """An ``.npy`` file of shape [N, ...] opened for writing or reading whole rows."""

    def __init__(self, path: Path, shape: tuple[int, ...], dtype: np.dtype, offset: int, fd: int):
        self.path, self.shape, self.dtype, self.offset, self.fd = Path(path), tuple(shape), np.dtype(dtype), offset, fd
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    @classmethod
    def create(cls, path: Path, shape: tuple[int, ...], dtype) -> RowFile:
        """A new file of ``shape``, all zeros (sparse until written)."""
        npy.open_memmap(path, mode="w+", dtype=dtype, shape=shape).flush()  # header and size only; nothing touched
        return cls.open(path, writable=True)

    @classmethod
    def open(cls, path: Path, writable: bool = False) -> RowFile:
        with open(path, "rb") as fh:
            version = npy.read_magic(fh)
            read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
            shape, fortran, dtype = read_header(fh)
            offset = fh.tell()
        if fortran:
            raise ValueError(f"{path}: a Fortran-ordered array; rows are not contiguous")
        return cls(path, shape, dtype, offset, os.open(path, os.O_RDWR if writable else os.O_RDONLY))

    def write(self, positions: np.ndarray, rows: np.ndarray) -> None:
        """Write ``rows`` [k, ...] at row ``positions`` [k], a run of consecutive positions per call."""
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        positions = np.asarray(positions, dtype=np.int64)
        if rows.shape[1:] != self.shape[1:] or len(rows) != len(positions):
            raise ValueError(f"{self.path}: {rows.shape} rows at {len(positions)} positions, file {self.shape}")
        breaks = np.flatnonzero(np.diff(positions) != 1) + 1
        for start, stop in zip([0, *breaks], [*breaks, len(positions)]):
            _pwrite_all(self.fd, rows[start:stop], self.offset + int(positions[start]) * self.row_bytes)

    def write_at(self, start: int, rows: np.ndarray) -> None:
        """Write ``rows`` [k, ...] as rows ``start`` to ``start + k``."""
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        if rows.shape[1:] != self.shape[1:] or start + len(rows) > self.shape[0]:
            raise ValueError(f"{self.path}: {rows.shape} rows at row {start}, file {self.shape}")
        _pwrite_all(self.fd, rows, self.offset + int(start) * self.row_bytes)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start`` to ``stop`` (exclusive)."""
        out = np.empty((stop - start, *self.shape[1:]), dtype=self.dtype)
        view = memoryview(out.reshape(-1).view(np.uint8))
        done, at = 0, self.offset + start * self.row_bytes
        while done < len(view):
            got = os.preadv(self.fd, [view[done:]], at + done)
            if got == 0:
                raise ValueError(f"{self.path}: ends before row {stop} (truncated?)")
            done += got
        return out

    def chunks(self, begin: int = 0, end: int | None = None):
        """(start, stop) row ranges of about CHUNK_BYTES each, covering rows ``begin`` to ``end`` (the whole file)."""
        step, end = max(1, CHUNK_BYTES // max(self.row_bytes, 1)), self.shape[0] if end is None else end
        for start in range(begin, end, step):
            yield start, min(start + step, end)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> RowFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _pwrite_all(fd: int, rows: np.ndarray, at: int) -> None:
    """Every byte of ``rows`` at byte ``at`` (one write may take fewer bytes than asked)."""
    view = memoryview(np.ascontiguousarray(rows).reshape(-1).view(np.uint8))
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], at + done)
