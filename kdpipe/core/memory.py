"""Giving freed memory back to the operating system after a large transient allocation.

Reading a split (Arrow buffers, then a pandas frame) and tokenising it (the fast tokenizer's per-row encodings, a
chunk at a time) allocate several times what they leave behind. Arrow's allocator (mimalloc) and glibc's keep the
freed pages for reuse, so without this a signal pass kept about 25 KB per row more resident than the token ids it
holds (measured for BBC News at max_length 64: 609 MB at 500 rows, 711 MB at 4,000): its memory grew with N.

A job run from the command line also lets Arrow allocate with the C library's malloc (:func:`use_system_allocator`):
reading a split of 200-character texts (about 230 bytes a row as Arrow strings) from its Parquet file raised the
resident memory by 780 bytes a row through mimalloc, which kept them, and by 550 at the peak through malloc, 270 after
(docs/design.md, "Compute").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os


def use_system_allocator() -> None:
    """Arrow's default memory pool becomes the C library's malloc, unless ``ARROW_DEFAULT_MEMORY_POOL`` names one."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return
    import pyarrow

    pyarrow.set_memory_pool(pyarrow.system_memory_pool())


def release_freed_memory() -> None:
    """Return the free pages of Arrow's memory pool and of glibc's heap to the operating system (no-op elsewhere)."""
    try:
        import pyarrow

        pyarrow.default_memory_pool().release_unused()
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        pass
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:  # not glibc (macOS, musl): nothing to trim
        pass
