"""Class subsets of teachers and the student's label layout (docs/methods.md §1).

A teacher covers all the dataset's labels, a list of them, or MUKI's slice ``{slice: k, of: K}`` of their order; the
student predicts over the dataset's labels in their order, and each teacher's block is placed through an index map.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kdpipe.core.store import KdpipeError
from kdpipe.data.settings import ClassSlice


def resolve_classes(classes: Sequence[str] | ClassSlice | None, labels: list[str], where: str) -> list[str]:
    """The classes a teacher covers (``classes``: its list, MUKI's slice k of K, or None for all), in dataset order;
    MUKI splits the N labels into K contiguous slices of N//K, the last one running to the end."""
    if classes is None or classes == "all":
        return list(labels)
    if isinstance(classes, ClassSlice):
        k, K = classes.slice, classes.of
        if not 0 <= k < K or len(labels) < K:
            raise KdpipeError(f"classes slice {k} of {K}: need 0 <= slice < of <= number of classes ({len(labels)})")
        width = len(labels) // K
        return labels[k * width : len(labels) if k == K - 1 else (k + 1) * width]
    unknown = [c for c in classes if c not in labels]
    if unknown:
        raise KdpipeError(f"{where}: class {unknown[0]!r} is not in the data; the data's labels are {labels}")
    if len(set(classes)) != len(classes):
        raise KdpipeError(f"{where}: a class is listed twice: {list(classes)}")
    return [c for c in labels if c in classes]


def teacher_blocks(
    teacher_classes: dict[str, list[str]], labels: list[str], *, policy: str = "any", where: str
) -> dict[str, np.ndarray]:
    """For each teacher, the student-label index of each of its local classes; every label must be covered, and the
    subsets ``"disjoint"``, ``"identical"`` (all labels each), ``"disjoint_or_identical"`` or ``"any"`` (``policy``)."""
    position = {name: i for i, name in enumerate(labels)}
    owners: dict[str, list[str]] = {c: [] for c in labels}
    blocks = {}
    for teacher, classes in teacher_classes.items():
        missing = [c for c in classes if c not in position]
        if missing:
            raise KdpipeError(f"{where}: teacher '{teacher}' predicts class {missing[0]!r}, which the data lacks")
        blocks[teacher] = np.array([position[c] for c in classes], dtype=np.int64)
        for c in classes:
            owners[c].append(teacher)
    uncovered = [c for c, who in owners.items() if not who]
    if uncovered:
        cover = "; ".join(f"{t}: {', '.join(cs)}" for t, cs in teacher_classes.items())
        raise KdpipeError(f"{where}: label {uncovered[0]!r} in the data is covered by no teacher ({cover})")
    identical = all(len(cs) == len(labels) for cs in teacher_classes.values())
    if policy == "identical" and not identical:
        partial = next(t for t, cs in teacher_classes.items() if len(cs) != len(labels))
        raise KdpipeError(
            f"{where}: teacher '{partial}' covers {len(teacher_classes[partial])} of the "
            f"{len(labels)} labels, but this method needs teachers that all cover the full label set"
        )
    if policy == "disjoint" or (policy == "disjoint_or_identical" and not identical):
        shared = {c: who for c, who in owners.items() if len(who) > 1}
        if shared:
            c, who = next(iter(shared.items()))
            raise KdpipeError(
                f"{where}: teachers {who} overlap on class {c!r}, but this method needs teachers "
                f"with {policy.replace('_', ' ')} class subsets"
            )
    return blocks
