"""Which of the run's arrivals a slot sends: one rule for the whole-run ``Schedule`` (an array of
indices at once, ``share_indices``) and the ``StreamedSchedule`` (one row at a time, ``in_share``).

Arrival k belongs to slot ``k % n_slots`` (docs/distributed.md). A lost worker's share is
re-planned onto m survivors as a split ``[m, j]``: survivor j takes the share's arrivals at
positions p (``k // n_slots``) with ``p % m == j``. A share re-planned again adds another split,
applied to ``p // m``: shares nest, stay disjoint and together cover the lost share once, and
session k stays session k whoever sends it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from workloads import arrivals


def share_indices(length: int, n_slots: int, slot: int, splits: list[list[int]] | None = None) -> np.ndarray:
    """Indices of the arrivals of ``slot`` among ``length``, narrowed by ``splits`` (ascending)."""
    mine = arrivals.worker_share(length, n_slots, slot)
    if not splits:
        return mine
    p = mine // n_slots
    keep = np.ones(len(mine), dtype=bool)
    for m, j in splits:
        keep &= (p % m) == j
        p = p // m
    return mine[keep]


def in_share(k: int, n_slots: int, slot: int, splits: Iterable[Iterable[int]] | None = None) -> bool:
    """Whether arrival ``k`` is in slot ``slot``'s share narrowed by ``splits`` (``share_indices``
    for one index, without an array: the streamed schedule asks it of every row)."""
    if k % n_slots != slot:
        return False
    p = k // n_slots
    for m, j in splits or ():
        if p % m != j:
            return False
        p //= m
    return True
