"""A serving instance with continuous batching and chunked prefill.

Iteration policy (the one perf/queueing.py models, implemented independently):

* Admission, first come first served: a routed request is admitted when the
  instance holds fewer than ``max_batch`` requests and its KV-cache reservation
  (prompt + output tokens; prompt only for a prefill-only unit) fits the
  instance's KV budget (an instance with nothing admitted takes any request, so
  an oversized one cannot block it forever).
* Every iteration runs one decode step for every request past its prefill, and
  one prefill chunk of up to ``chunk_tokens`` tokens taken in order from the
  admitted prompts (a prompt longer than the chunk spans several iterations;
  several short prompts can share one chunk). The iteration lasts the decode
  step plus the chunk pass (two passes of the model; perf/forward.py).
* A prompt's last chunk produces its first token; every later iteration gives
  each decoding request one more token. A prefill-only instance hands the
  request to a decode instance after its first token.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from energyopt.online.local_scheduler import LocalScheduler
from energyopt.sim.metrics import WorkloadStats
from energyopt.sim.passes import PassTable
from energyopt.spec.workload import Phase


@dataclass
class Requests:
    """Per-request state, as lists indexed by request id (fast scalar access)."""

    arrival_s: list[float]
    workload: list[int]
    prompt: list[int]
    output: list[int]
    first_token_s: list[float] = field(default_factory=list)
    done: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        self.first_token_s = [-1.0] * n
        self.done = [False] * n


class DuplicateCompletion(RuntimeError):
    """A request completed twice (a simulator bug)."""


@dataclass
class IterationOutcome:
    """What an iteration's end produced, for the engine to route."""

    handoffs: list[int] = field(default_factory=list)
    completed: int = 0
    on_time: int = 0  # first tokens within the workload's TTFT SLO
    late: int = 0  # first tokens after it


class Server:
    """One placement of the plan: a workload phase on a GPU slice or a TP group."""

    def __init__(
        self,
        sid: int,
        key: tuple[object, ...],
        workload: int,
        phase: Phase,
        gpus: list[str],
        share_frac: float,
        weight_rps: float,
        table: PassTable,
        *,
        chunk_tokens: int,
        max_batch: int,
        kv_budget_tokens: float,
        ready_s: float,
        stats: WorkloadStats,
        requests: Requests,
    ) -> None:
        self.sid = sid
        self.key = key
        self.workload = workload
        self.phase = phase
        self.gpus = gpus
        self.share_frac = share_frac
        self.weight_rps = weight_rps
        self.table = table
        self.chunk_tokens = chunk_tokens
        self.max_batch = max_batch
        self.kv_budget = kv_budget_tokens
        self.ready_s = ready_s
        self.stats = stats
        self.req = requests
        self.waiting: deque[int] = deque()  # routed, not admitted
        self.prefill: deque[list[int]] = deque()  # [request, prompt tokens left]
        self.joiners: deque[int] = deque()  # handed off to this decode instance
        self.n = 0  # decoding requests
        self.ctx_sum = 0.0  # their summed context, tokens
        self.finish_at: dict[int, list[int]] = {}
        self.iter = 0
        self.busy = False
        self.last_end_s = 0.0
        self.kv_used = 0
        self.draining = False
        self.removed = False
        self.wrr = 0.0  # smooth weighted round-robin state
        # the iteration in flight
        self._n = 0
        self._chunk_done: list[int] = []
        self._joined: list[int] = []
        self.start_s = 0.0
        self.local: LocalScheduler | None = None  # online local scheduler, if any

    @property
    def queued(self) -> int:
        """Requests routed here without a first token yet (waiting or in prefill)."""
        return len(self.waiting) + len(self.prefill) + len(self.joiners)

    @property
    def batch(self) -> int:
        """Requests decoding now."""
        return self.n

    @property
    def kv_fraction(self) -> float:
        """KV-cache reservation in use over the budget."""
        return self.kv_used / self.kv_budget if self.kv_budget > 0 else 1.0

    @property
    def held(self) -> int:
        """Requests admitted and not finished here."""
        return self.n + len(self.prefill)

    def empty(self) -> bool:
        """Nothing routed, admitted or running."""
        return not (self.busy or self.n or self.prefill or self.waiting or self.joiners)

    def has_work(self) -> bool:
        """Something an iteration could do now or after admission."""
        return bool(self.n or self.prefill or self.waiting or self.joiners)

    def _admit(self) -> None:
        req = self.req
        if self.phase == "decode":
            while self.joiners and self.n < self.max_batch:
                rid = self.joiners[0]
                need = req.prompt[rid] + req.output[rid]
                if self.kv_used + need > self.kv_budget and self.kv_used > 0:
                    break
                self.joiners.popleft()
                self.kv_used += need
                self.n += 1
                self.ctx_sum += req.prompt[rid] + 1
                self.finish_at.setdefault(self.iter + req.output[rid] - 2, []).append(rid)
                self._joined.append(rid)
            return
        with_output = self.phase == "both"
        while self.waiting and self.n + len(self.prefill) < self.max_batch:
            rid = self.waiting[0]
            need = req.prompt[rid] + (req.output[rid] if with_output else 0)
            if self.kv_used + need > self.kv_budget and self.kv_used > 0:
                break
            self.waiting.popleft()
            self.kv_used += need
            self.prefill.append([rid, req.prompt[rid]])

    def begin(self, now_s: float) -> tuple[float, float] | None:
        """Start an iteration: (duration s, dynamic energy per GPU J), or None if idle."""
        self._joined = []
        budget = self.chunk_tokens
        if self.local is not None:
            head = self.prefill[0][0] if self.prefill else (self.waiting[0] if self.waiting else -1)
            wait_ms = (now_s - self.req.arrival_s[head]) * 1e3 if head >= 0 else 0.0
            ctx = self.ctx_sum / self.n if self.n else 0.0
            self.max_batch, budget = self.local.step(
                self.n, ctx, wait_ms, self.table.decode, self.table.prefill
            )
        self._admit()
        chunk = 0
        done: list[int] = []
        for entry in self.prefill:
            take = entry[1] if entry[1] < budget else budget
            entry[1] -= take
            chunk += take
            budget -= take
            if entry[1] == 0:
                done.append(entry[0])
            if budget == 0:
                break
        n = self.n
        if n == 0 and chunk == 0:
            return None
        ms = 0.0
        joules = 0.0
        if n:
            ms, joules = self.table.decode(n, self.ctx_sum / n)
        if chunk:
            p_ms, p_j = self.table.prefill(chunk)
            ms += p_ms
            joules += p_j
        self._n = n
        self._chunk_done = done
        self.busy = True
        self.start_s = now_s
        return ms / 1e3, joules

    def end(self, now_s: float) -> IterationOutcome:
        """Finish the iteration in flight: tokens, first tokens, completions."""
        req = self.req
        stats = self.stats
        out = IterationOutcome()
        i = self.iter
        n = self._n
        joined = self._joined
        bulk = n - len(joined)
        if bulk > 0:
            stats.gaps((now_s - self.last_end_s) * 1e3, bulk)
        for rid in joined:
            stats.gaps((now_s - req.first_token_s[rid]) * 1e3, 1)
        self.ctx_sum += n
        finished = self.finish_at.pop(i, None)
        if finished:
            for rid in finished:
                size = req.prompt[rid] + req.output[rid]
                self.n -= 1
                self.ctx_sum -= size
                self.kv_used -= size
                self._complete(rid, now_s)
                out.completed += 1
        for rid in self._chunk_done:
            self.prefill.popleft()
            req.first_token_s[rid] = now_s
            if stats.first_token((now_s - req.arrival_s[rid]) * 1e3):
                out.on_time += 1
            else:
                out.late += 1
            if self.phase == "prefill":
                self.kv_used -= req.prompt[rid]
                if req.output[rid] > 1:
                    out.handoffs.append(rid)
                    continue
            elif req.output[rid] > 1:
                self.n += 1
                self.ctx_sum += req.prompt[rid] + 1
                self.finish_at.setdefault(i + req.output[rid] - 1, []).append(rid)
                continue
            else:
                self.kv_used -= req.prompt[rid] + req.output[rid]
            self._complete(rid, now_s)
            out.completed += 1
        self.iter = i + 1
        self.last_end_s = now_s
        self.busy = False
        return out

    def _complete(self, rid: int, now_s: float) -> None:
        req = self.req
        if req.done[rid]:
            raise DuplicateCompletion(f"request {rid} completed twice")
        req.done[rid] = True
        first = req.first_token_s[rid]
        gaps = req.output[rid] - 1
        tpot_ms = (now_s - first) * 1e3 / gaps if gaps > 0 else 0.0
        self.stats.finished((first - req.arrival_s[rid]) * 1e3, tpot_ms)

    def set_table(self, table: PassTable) -> None:
        """New latency tables (after a clock change)."""
        self.table = table
