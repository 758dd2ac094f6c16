"""A schedule as a program: pieces of the message and the sends of every step.

Pieces are shares of the message (``frac`` of its bytes). Before the first step,
a rank holds what the collective gives it (collective.md, section 3): its own
contribution to every piece (all-reduce, reduce-scatter), the pieces it owns
(all-gather, all-to-all: ``owner``), or everything at the root (broadcast). A send
(``src``, ``dst``, ``piece``, ``reduce``) moves what ``src`` holds of the piece at
the start of the step; ``reduce`` adds it into the receiver's copy, otherwise it
replaces it. Every send of a step runs at the same time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from energyopt.families.collective.spec import Op

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]

NONE = -1


@dataclass(frozen=True)
class Program:
    """A schedule over ``n`` ranks: pieces and steps of sends."""

    op: Op
    n: int
    frac: FloatArray
    """(P,): each piece's share of the message bytes."""
    owner: IntArray
    """(P,): the rank whose input the piece is (all-gather, all-to-all), else NONE."""
    dest: IntArray
    """(P,): the rank that must end with the piece (reduce-scatter, all-to-all), else NONE."""
    steps: tuple[IntArray, ...]
    """Per step an (k, 4) array of sends: src, dst, piece, reduce (0/1)."""
    chan: IntArray | None = None
    """(P,): the channel each piece travels on (None: all on channel 0)."""

    def channel_of(self) -> IntArray:
        """(P,): the channel of every piece."""
        return self.chan if self.chan is not None else np.zeros(self.n_pieces, dtype=np.int64)

    @property
    def n_pieces(self) -> int:
        return int(self.frac.shape[0])

    @property
    def n_sends(self) -> int:
        return sum(int(s.shape[0]) for s in self.steps)


@dataclass(frozen=True)
class Scatter:
    """How to apply ``target[i] = max(target[i], values[j])`` for every j with
    ``idx[j] == i`` (``np.maximum.at``) to rows of 2-D arrays fast, planned once
    per index array: direct when the indices are distinct, else by sorting."""

    order: IntArray | None
    """None: the indices are distinct."""
    starts: IntArray
    at: IntArray

    @staticmethod
    def of(idx: IntArray) -> Scatter:
        order = np.argsort(idx, kind="stable")
        si = idx[order]
        starts = np.flatnonzero(np.concatenate(([True], si[1:] != si[:-1]))) if len(si) else si
        if len(starts) == len(idx):
            return Scatter(None, starts, idx)
        return Scatter(order, starts, si[starts])

    def apply(self, target: FloatArray, values: FloatArray) -> None:
        if len(self.at) == 0:
            return
        if self.order is not None:
            values = np.maximum.reduceat(values[self.order], self.starts, axis=0)
        target[self.at] = np.maximum(target[self.at], values)


def sends(rows: list[tuple[int, int, int, int]]) -> IntArray:
    """One step's sends as an array (src, dst, piece, reduce)."""
    if not rows:
        return np.zeros((0, 4), dtype=np.int64)
    return np.asarray(rows, dtype=np.int64).reshape(-1, 4)


def concat_steps(*parts: tuple[IntArray, ...]) -> tuple[IntArray, ...]:
    """Phases one after another."""
    out: list[IntArray] = []
    for part in parts:
        out.extend(part)
    return tuple(out)


def parallel(programs: list[Program]) -> Program:
    """Programs over disjoint pieces run side by side (channels): step i of every
    program runs in step i; piece shares are divided by their number."""
    first = programs[0]
    k = len(programs)
    offsets = np.cumsum([0] + [q.n_pieces for q in programs])
    n_steps = max(len(q.steps) for q in programs)
    steps: list[IntArray] = []
    for i in range(n_steps):
        rows = []
        for j, q in enumerate(programs):
            if i < len(q.steps) and q.steps[i].shape[0]:
                s = q.steps[i].copy()
                s[:, 2] += offsets[j]
                rows.append(s)
        steps.append(np.concatenate(rows) if rows else sends([]))
    return Program(
        op=first.op,
        n=first.n,
        frac=np.concatenate([q.frac / k for q in programs]),
        owner=np.concatenate([q.owner for q in programs]),
        dest=np.concatenate([q.dest for q in programs]),
        steps=tuple(steps),
        chan=np.concatenate(
            [np.full(q.n_pieces, j, dtype=np.int64) for j, q in enumerate(programs)]
        ),
    )


def pipelined(prog: Program, chunks: int) -> list[tuple[IntArray, FloatArray, FloatArray]]:
    """The program cut into ``chunks`` equal chunks, chunk j's step s running in step
    s + j: per global step its flows (src, dst, reduce, channel) and their bytes as shares of
    the message and the part of them that is reduced at the receiver (sends between
    the same pair on the same channel in a step are one flow, which may carry
    reducing and copying sends of different chunks)."""
    chan = prog.channel_of()
    n_steps = len(prog.steps)
    out: list[tuple[IntArray, FloatArray, FloatArray]] = []
    for g in range(n_steps + chunks - 1):
        parts = [prog.steps[s] for s in range(max(0, g - chunks + 1), min(n_steps, g + 1))]
        rows = [p for p in parts if p.shape[0]]
        if not rows:
            out.append((np.zeros((0, 4), dtype=np.int64), np.zeros(0), np.zeros(0)))
            continue
        allr = np.concatenate(rows)
        share = prog.frac[allr[:, 2]] / chunks
        key = (chan[allr[:, 2]] * prog.n + allr[:, 0]) * prog.n + allr[:, 1]
        uniq, inv = np.unique(key, return_inverse=True)
        total = np.zeros(len(uniq))
        np.add.at(total, inv, share)
        reduced = np.zeros(len(uniq))
        np.add.at(reduced, inv, share * allr[:, 3])
        red = np.zeros(len(uniq), dtype=np.int64)
        np.maximum.at(red, inv, allr[:, 3])
        pair = uniq % (prog.n * prog.n)
        ch = uniq // (prog.n * prog.n)
        flows = np.stack([pair // prog.n, pair % prog.n, red, ch], axis=1).astype(np.int64)
        out.append((flows, total, reduced))
    return out
