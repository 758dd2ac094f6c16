"""Measured pairwise co-location slowdowns and a predictor fitted on them.

The measurements are Gavel's (Narayanan et al., OSDI'20; ``data/sharing/gavel/``,
MIT): training throughput (steps/s) of 26 job types (ResNet-18/50, Transformer,
A3C, CycleGAN, LM, Recommendation at several batch sizes) on one K80, P100 or
V100, alone and with each other job type on the same whole GPU. The slowdown of
job type a next to type b on GPU type g is

    sigma_g(a, b) = alone_g(a) / paired_g(a, b)      (>= 1 up to measurement noise)

A pair recorded with throughput 0 did not run (out of memory); a job type with
alone throughput 0 does not run on that GPU type at all.

Predictor (``fit_pair_model``; ``PREDICTOR`` is the one the scheduler uses): for
each GPU type g a low-rank model of the log slowdown,

    log sigma_g(a, b) = c_g + u_{g,a} + v_{g,b} + p_{g,a} . q_{g,b}

(c an offset, u the sensitivity of a, v the aggressiveness of b, p and q rank-r
interaction vectors), fitted to the measured pairs by ridge-regularized
alternating least squares. The baselines it is compared with are special cases:
a constant per GPU type (u = v = p = q = 0) and additive job effects (p = q = 0,
shared over GPU types or per GPU type). ``cross_validate`` measures each on
unordered pairs held out of the fit: a held-out pair {a, b} is removed in both
orders and on every GPU type, so the predictor never saw the pair anywhere.
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from energyopt.perf.params import FloatArray
from energyopt.spec.errors import SpecError

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

GAVEL_FILE = Path("sharing/gavel/physical_cluster_throughputs.json")
"""The measurements, relative to the data folder (data/README.md)."""
GAVEL_GPU_TYPES = ("k80", "p100", "v100")
"""GPU types of the single-GPU (consolidated) measurements."""


@dataclass(frozen=True)
class MeasuredPairs:
    """Measured throughputs of job types alone and in pairs on whole GPUs.

    ``alone[g, a]``: steps/s of job type a alone on GPU type g (0: does not run);
    ``paired[g, a, b]``: steps/s of a while b runs on the same GPU (0: the pair
    did not run).
    """

    source: str
    gpu_types: tuple[str, ...]
    job_types: tuple[str, ...]
    alone: FloatArray
    paired: FloatArray

    def runs(self) -> BoolArray:
        """[g, a, b]: the pair ran on g (both throughputs measured above 0)."""
        return np.asarray(
            (self.paired > 0)
            & (np.swapaxes(self.paired, 1, 2) > 0)
            & (self.alone[:, :, None] > 0)
            & (self.alone[:, None, :] > 0)
        )

    def slowdown(self) -> FloatArray:
        """[g, a, b]: measured sigma_g(a, b) = alone / paired; NaN where the pair did not run."""
        ok = self.runs()
        safe = np.where(ok, self.paired, 1.0)
        return np.asarray(np.where(ok, self.alone[:, :, None] / safe, np.nan))


def _number(value: Any, where: str, problems: list[str]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        problems.append(f"{where}: expected a finite number, got {value!r}")
        return 0.0
    if value < 0:
        problems.append(f"{where}: negative throughput {value}")
        return 0.0
    return float(value)


def _key(text: str, where: str, problems: list[str]) -> tuple[str, int] | None:
    try:
        key = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        key = None
    if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str)):
        problems.append(f"{where}: key {text!r} is not ('job type', scale factor)")
        return None
    if not isinstance(key[1], int):
        problems.append(f"{where}: key {text!r}: scale factor is not an integer")
        return None
    return key[0], key[1]


def load_gavel(path: str | Path, gpu_types: tuple[str, ...] = GAVEL_GPU_TYPES) -> MeasuredPairs:
    """Read Gavel's ``physical_cluster_throughputs.json`` (single-GPU entries only).

    Checks that every job type is measured on every GPU type, alone and next to
    every job type, and that a pair measured in both orders agrees (the pair
    [a, b] under a's entry equals [b, a] under b's). Raises SpecError naming the
    file and the entry for each problem.
    """
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError([f"{p}: {exc}"]) from None
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise SpecError([f"{p}: expected an object keyed by GPU type"])
    tables: list[dict[str, dict[str, Any]]] = []
    names: list[str] | None = None
    for g in gpu_types:
        entry = raw.get(g)
        if not isinstance(entry, dict):
            problems.append(f"{p}: {g}: missing GPU type")
            continue
        singles: dict[str, dict[str, Any]] = {}
        for text, value in entry.items():
            key = _key(text, f"{p}: {g}", problems)
            if key is None or key[1] != 1:
                continue
            if not isinstance(value, dict) or "null" not in value:
                problems.append(f"{p}: {g}.{text}: no 'null' (alone) throughput")
                continue
            singles[key[0]] = value
        if names is None:
            names = list(singles)
        elif set(singles) != set(names):
            odd = sorted(set(singles) ^ set(names))
            problems.append(f"{p}: {g}: job types differ from {gpu_types[0]}'s: {odd}")
        tables.append(singles)
    if problems or names is None:
        raise SpecError(problems or [f"{p}: no GPU types"])
    n_g, n_j = len(gpu_types), len(names)
    alone = np.zeros((n_g, n_j))
    paired = np.zeros((n_g, n_j, n_j))
    partner = np.zeros((n_g, n_j, n_j))
    for gi, (g, singles) in enumerate(zip(gpu_types, tables, strict=True)):
        for a, name_a in enumerate(names):
            value = singles[name_a]
            field = f"{p}: {g}.{(name_a, 1)!r}"
            alone[gi, a] = _number(value["null"], f"{field}.null", problems)
            for b, name_b in enumerate(names):
                pair = value.get(repr((name_b, 1)))
                where = f"{field}.{(name_b, 1)!r}"
                if not (isinstance(pair, list) and len(pair) == 2):
                    problems.append(f"{where}: expected [this job, other job] throughputs")
                    continue
                paired[gi, a, b] = _number(pair[0], where, problems)
                partner[gi, a, b] = _number(pair[1], where, problems)
        swapped = np.swapaxes(partner[gi], 0, 1)
        differ = ~np.isclose(paired[gi], swapped, rtol=1e-9, atol=1e-12)
        for a, b in zip(*np.nonzero(differ), strict=True):
            problems.append(
                f"{p}: {g}: pair ({names[a]!r}, {names[b]!r}) measured as "
                f"{paired[gi, a, b]} steps/s for {names[a]!r} under its entry and "
                f"{swapped[a, b]} under {names[b]!r}'s"
            )
    if problems:
        raise SpecError(problems)
    return MeasuredPairs(str(p), tuple(gpu_types), tuple(names), alone, paired)


# ---------------------------------------------------------------------------
# the predictor


@dataclass(frozen=True)
class PairModelSpec:
    """Which terms a pair model has: job effects (per GPU type or shared) and a rank."""

    name: str
    job_effects: bool = True
    per_gpu_type: bool = True
    rank: int = 0
    ridge: float = 1.0
    iterations: int = 60
    seed: int = 0


PREDICTOR = PairModelSpec("low rank per GPU type (rank 2)", rank=2)
"""The predictor the measured-pairs scheduler uses (docs/formulations/colocation.md)."""
BASELINES = (
    PairModelSpec("constant per GPU type", job_effects=False),
    PairModelSpec("additive, job effects shared over GPU types", per_gpu_type=False),
    PairModelSpec("additive per GPU type"),
)


@dataclass(frozen=True)
class PairModel:
    """A fitted model of log sigma_g(a, b) (see the module docstring)."""

    spec: PairModelSpec
    offset: FloatArray  # [g]
    row: FloatArray  # [g, a]: u
    col: FloatArray  # [g, b]: v
    p: FloatArray  # [g, a, r]
    q: FloatArray  # [g, b, r]

    def log_slowdown(self) -> FloatArray:
        """[g, a, b]: predicted log sigma for every pair of job types."""
        inter = np.einsum("gar,gbr->gab", self.p, self.q)
        effects = self.offset[:, None, None] + self.row[:, :, None] + self.col[:, None, :]
        return np.asarray(effects + inter)

    def slowdown(self) -> FloatArray:
        """[g, a, b]: predicted sigma (a factor >= 1: a slowdown below 1 is not predicted)."""
        return np.asarray(np.maximum(np.exp(self.log_slowdown()), 1.0))


def fit_pair_model(log_sigma: FloatArray, observed: BoolArray, spec: PairModelSpec) -> PairModel:
    """Fit ``spec`` to ``log_sigma[g, a, b]`` where ``observed`` (ridge ALS).

    Block coordinate descent on the ridge-penalized squared error (the offsets
    are not penalized): offsets, then row effects, column effects, p and q in
    closed form given the rest. Deterministic for a given ``spec.seed``.
    """
    n_g, n_a, n_b = log_sigma.shape
    w = observed.astype(np.float64)
    y = np.where(observed, log_sigma, 0.0)
    lam = spec.ridge
    rank = spec.rank
    rng = np.random.default_rng(spec.seed)
    offset = np.zeros(n_g)
    row = np.zeros((n_g, n_a))
    col = np.zeros((n_g, n_b))
    p = rng.normal(0.0, 0.1, (n_g, n_a, rank))
    q = rng.normal(0.0, 0.1, (n_g, n_b, rank))
    eye = lam * np.eye(rank)
    sweeps = spec.iterations if (spec.job_effects or rank) else 1
    for _ in range(sweeps):
        inter = np.einsum("gar,gbr->gab", p, q)
        r = y - row[:, :, None] - col[:, None, :] - inter
        offset = (w * r).sum(axis=(1, 2)) / np.maximum(w.sum(axis=(1, 2)), 1.0)
        if spec.job_effects:
            r = y - offset[:, None, None] - col[:, None, :] - inter
            if spec.per_gpu_type:
                row = (w * r).sum(axis=2) / (w.sum(axis=2) + lam)
            else:
                shared = (w * r).sum(axis=(0, 2)) / (w.sum(axis=(0, 2)) + lam)
                row = np.broadcast_to(shared, (n_g, n_a)).copy()
            r = y - offset[:, None, None] - row[:, :, None] - inter
            if spec.per_gpu_type:
                col = (w * r).sum(axis=1) / (w.sum(axis=1) + lam)
            else:
                shared = (w * r).sum(axis=(0, 1)) / (w.sum(axis=(0, 1)) + lam)
                col = np.broadcast_to(shared, (n_g, n_b)).copy()
        if rank:
            r = y - offset[:, None, None] - row[:, :, None] - col[:, None, :]
            a_mat = np.einsum("gab,gbr,gbs->gars", w, q, q) + eye
            p = np.linalg.solve(a_mat, np.einsum("gab,gbr->gar", w * r, q)[..., None])[..., 0]
            b_mat = np.einsum("gab,gar,gas->gbrs", w, p, p) + eye
            q = np.linalg.solve(b_mat, np.einsum("gab,gar->gbr", w * r, p)[..., None])[..., 0]
    return PairModel(spec, offset, row, col, p, q)


def fit_measured(data: MeasuredPairs, spec: PairModelSpec = PREDICTOR) -> PairModel:
    """``spec`` fitted on every measured pair of ``data``."""
    ok = data.runs()
    return fit_pair_model(np.log(np.where(ok, data.slowdown(), 1.0)), ok, spec)


def pair_folds(job_types: int, folds: int, seed: int) -> IntArray:
    """[a, b]: the fold of each unordered pair {a, b} (symmetric), seeded shuffle."""
    pairs = [(a, b) for a in range(job_types) for b in range(a, job_types)]
    order = np.random.default_rng(seed).permutation(len(pairs))
    fold = np.zeros((job_types, job_types), dtype=np.int64)
    for position, index in enumerate(order):
        a, b = pairs[index]
        fold[a, b] = fold[b, a] = position % folds
    return fold


@dataclass(frozen=True)
class HeldOutError:
    """Error of a model's slowdown on measured pairs held out of its fit.

    ``mape``: mean |predicted - measured| / measured over ordered (GPU type, a, b)
    entries; ``median_ape`` its median; ``rmse_log``: root mean squared error of
    log sigma; ``mape_per_gpu``: mape on each GPU type.
    """

    name: str
    entries: int
    pairs: int
    mape: float
    median_ape: float
    rmse_log: float
    mape_per_gpu: tuple[float, ...]


def cross_validate(
    data: MeasuredPairs, spec: PairModelSpec, folds: int = 5, seed: int = 1
) -> HeldOutError:
    """k-fold over unordered job-type pairs: fit on the other folds, score the held-out one.

    A held-out pair is removed in both orders and on every GPU type.
    """
    ok = data.runs()
    sigma = np.where(ok, data.slowdown(), 1.0)
    log_sigma = np.log(sigma)
    fold = pair_folds(len(data.job_types), folds, seed)
    predicted = held_out_slowdown(data, spec, folds, seed)
    ape = np.abs(predicted - sigma) / sigma
    log_err = np.log(predicted) - log_sigma
    per_gpu = tuple(float(np.mean(ape[g][ok[g]])) for g in range(len(data.gpu_types)))
    upper = np.triu(np.ones(fold.shape, dtype=bool))
    return HeldOutError(
        spec.name,
        int(ok.sum()),
        int((ok.any(axis=0) & upper).sum()),
        float(np.mean(ape[ok])),
        float(np.median(ape[ok])),
        float(np.sqrt(np.mean(log_err[ok] ** 2))),
        per_gpu,
    )


def held_out_slowdown(
    data: MeasuredPairs, spec: PairModelSpec = PREDICTOR, folds: int = 5, seed: int = 1
) -> FloatArray:
    """[g, a, b]: each pair's slowdown predicted by ``spec`` fitted without that pair.

    The k-fold predictions of ``cross_validate``: every unordered pair {a, b} is
    predicted by the model fitted on the other folds (both orders and every GPU
    type of the pair left out), so a scheduler given this table never sees the
    measurement it is scored on.
    """
    ok = data.runs()
    log_sigma = np.log(np.where(ok, data.slowdown(), 1.0))
    fold = pair_folds(len(data.job_types), folds, seed)
    predicted = np.ones_like(log_sigma)
    for k in range(folds):
        test = fold[None, :, :] == k
        model = fit_pair_model(log_sigma, ok & ~test, spec)
        predicted = np.where(test, model.slowdown(), predicted)
    return np.asarray(predicted)


# ---------------------------------------------------------------------------
# jobs of measured types on a cluster of whole GPUs, and plans for them


@dataclass(frozen=True)
class MeasuredJob:
    """A training job of a measured type: ``steps`` steps to run, arriving at time 0."""

    name: str
    job_type: int  # index into MeasuredPairs.job_types
    steps: float


@dataclass(frozen=True)
class MeasuredCluster:
    """Whole GPUs of the measured types: ``counts[g]`` GPUs of ``gpu_types[g]``."""

    gpu_types: tuple[str, ...]
    counts: tuple[int, ...]

    def gpu_ids(self) -> list[tuple[str, int]]:
        """(GPU id ``type/i``, GPU type index) of every GPU."""
        return [
            (f"{name}/{i}", g)
            for g, (name, count) in enumerate(zip(self.gpu_types, self.counts, strict=True))
            for i in range(count)
        ]


@dataclass(frozen=True)
class MeasuredUnit:
    """One job alone, or two jobs sharing it, on one whole GPU from ``start_s`` (s)."""

    gpu: str
    start_s: float
    jobs: tuple[str, ...]


@dataclass(frozen=True)
class MeasuredPlan:
    """Units of a measured-pairs schedule; ``objective_s`` the scheduler's own mean JCT (s)."""

    units: tuple[MeasuredUnit, ...]
    objective_s: float
    solver: str


def measured_jobs(
    data: MeasuredPairs,
    count: int,
    seed: int,
    min_hours: float = 0.5,
    max_hours: float = 8.0,
    reference: str = "v100",
) -> list[MeasuredJob]:
    """``count`` jobs of uniformly drawn measured types (those that run alone on every
    GPU type), each with a run time alone on ``reference`` drawn log-uniformly in
    [min_hours, max_hours], turned into steps with the measured throughput. Seeded."""
    g = data.gpu_types.index(reference)
    types = [a for a in range(len(data.job_types)) if bool(np.all(data.alone[:, a] > 0))]
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(count):
        a = int(rng.choice(types))
        hours = math.exp(rng.uniform(math.log(min_hours), math.log(max_hours)))
        jobs.append(MeasuredJob(f"j{i}", a, hours * 3600.0 * float(data.alone[g, a])))
    return jobs
