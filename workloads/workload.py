"""The ``Workload`` interface every source of sessions implements (synthetic specs, session files).

A workload is a pure function ``(seed, index) -> Session``: session k is the same whatever the number
of workers or of sessions asked for, which is what pairs the two arms of an A/B run.
"""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import numpy as np

from workloads.errors import WorkloadError
from workloads.model import Session
from workloads.text import BUILTIN, TextTokenizer


class Workload(ABC):
    """Sessions by (seed, index), plus what a run records about where they came from.

    Attributes: ``name`` (the spec's name or the session file's stem), ``source`` (the shipped spec
    name or the file path), ``kind`` (``"synthetic"`` or ``"sessions"``).
    """

    name: str
    source: str
    kind: str
    # Builds synthetic texts and counts tokens; --tokenizer swaps in an exact one.
    tokenizer: TextTokenizer = BUILTIN

    @property
    @abstractmethod
    def num_sessions(self) -> int | None:
        """How many sessions exist: None for a synthetic spec (unbounded), N for a session file."""

    @property
    @abstractmethod
    def tenants(self) -> tuple[str, ...]:
        """The tenant names sessions may carry, in spec or file order."""

    @abstractmethod
    def session(self, seed: int, index: int) -> Session:
        """Session ``index`` (0-based) for ``seed``; depends on nothing else."""

    @abstractmethod
    def fingerprint(self) -> str:
        """Hex sha256 of what determines the sessions, so runs on different workloads are told apart."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description for run.json: kind, name, source, fingerprint and the content."""

    def with_tokenizer(self, fingerprint: str) -> str:
        """``fingerprint`` extended by a non-built-in tokenizer's, which builds other texts."""
        desc = self.tokenizer.describe()
        if desc.get("kind") == BUILTIN.kind:
            return fingerprint
        return hashlib.sha256(
            f"{fingerprint}:tokenizer:{desc.get('sha256', desc['name'])}".encode()
        ).hexdigest()

    def sessions_available(self, at_most: int | None = None) -> int | None:
        """``num_sessions``, counted up to ``at_most`` at least: a streamed trace
        (``workloads.streamed``) reads only that far to tell whether it holds that many."""
        return self.num_sessions

    def has_arrival_times(self) -> bool:
        """Whether the source carries arrival times (``arrival_offsets`` is not None), told without
        reading a streamed trace whole."""
        return self.arrival_offsets() is not None

    def arrival_offsets(self) -> np.ndarray | None:
        """Arrival offsets carried by the source (seconds from the first, one per session, sorted).

        None when the source has no timing (specs, datasets without timestamps): arrivals then come
        from the arrival process. Session k is the k-th arrival.
        """
        return None

    def turn_hash_ids(self, index: int) -> list[dict[str, Any] | None] | None:
        """Per turn of session ``index``, the prefix blocks its text is built from, if any:
        ``{"hash_ids": [...], "block_size": B, "tokens": N}`` (a trace's shared blocks), else None.

        A counts-only export writes them, so its replay rebuilds the same shared prefixes. None
        (the default) when no turn is built from blocks.
        """
        return None

    def sessions(self, seed: int, n: int, start: int = 0) -> Iterator[Session]:
        """Sessions ``start .. start+n-1``."""
        for index in range(start, start + n):
            yield self.session(seed, index)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} from {self.source!r}>"


def check_seed_index(seed: Any, index: Any, num_sessions: int | None, *, where: str) -> None:
    """Raise a one-line WorkloadError for a bad seed or an index outside the workload."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise WorkloadError(f"{where}: seed {seed!r} is not allowed; use an integer")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise WorkloadError(f"{where}: session index {index!r} is not allowed; use an integer >= 0")
    if num_sessions is not None and index >= num_sessions:
        raise WorkloadError(
            f"{where}: session index {index} is out of range; the file holds {num_sessions} sessions "
            f"(0..{num_sessions - 1})"
        )


class SessionRandom:
    """``random.Random(seed)``, seeded on first use.

    Seeding a Mersenne Twister from a string takes ~6 µs, and a session opens one stream per
    aspect (7-8) while a spec with fixed lengths and no think time draws from one or two of them:
    at hundreds of sessions a second the unused ones were a few per cent of a worker's CPU.
    The draws are the very ones ``random.Random(seed)`` gives.
    """

    __slots__ = ("_rng", "_seed")

    def __init__(self, seed: str) -> None:
        self._seed = seed
        self._rng: random.Random | None = None

    def __getattr__(self, name: str) -> Any:
        rng = self._rng
        if rng is None:
            rng = self._rng = random.Random(self._seed)
        return getattr(rng, name)


def session_rng(seed: int, index: int, stream: str) -> SessionRandom:
    """The RNG of one aspect (``stream``) of session ``index`` (a ``random.Random``, seeded when
    first drawn from).

    String seeds hash with SHA-512 inside ``random.Random``, so this is stable across processes and
    Python runs. One stream per aspect means changing, say, ``output_tokens`` leaves the prompt texts
    of every session unchanged.
    """
    return SessionRandom(f"{seed}:{index}:{stream}")


def session_id(seed: int, index: int) -> str:
    """The stable id of synthetic session ``index``: ``s{seed}-{index:06d}``."""
    return f"s{seed}-{index:06d}"


def system_prompt_text(seed: int, tenant: str, n_tokens: int, tokenizer: TextTokenizer = BUILTIN) -> str:
    """A tenant's system prompt: the same text for every session of ``tenant`` under ``seed``.

    Built from (seed, tenant) only, and the shorter prompt is a prefix of the longer one, so a prefix
    cache shares it across the tenant's sessions.
    """
    return tokenizer.text(n_tokens, random.Random(f"{seed}:system:{tenant}:text"))
