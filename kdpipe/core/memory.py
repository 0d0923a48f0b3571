"""Giving freed memory back to the operating system after a large transient allocation.

Reading and tokenising a split allocate several times what they keep, and Arrow's and glibc's allocators hold the
freed pages; a job also lets Arrow use the C library's malloc (:func:`use_system_allocator`; docs/design.md,
"Compute").
"""

from __future__ import annotations

import ctypes
import os


def use_system_allocator() -> None:
    """Arrow's default memory pool becomes the C library's malloc, unless ``ARROW_DEFAULT_MEMORY_POOL`` names one."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return
    import pyarrow

    pyarrow.set_memory_pool(pyarrow.system_memory_pool())


def release_freed_memory() -> None:
    """Return the free pages of Arrow's memory pool and of glibc's heap to the operating system (no-op elsewhere)."""
    import pyarrow

    pyarrow.default_memory_pool().release_unused()
    libc = ctypes.CDLL(None)  # (the symbols of the process: its C library's among them)
    if hasattr(libc, "malloc_trim"):  # glibc's alone (not macOS's, not musl's)
        libc.malloc_trim(0)
