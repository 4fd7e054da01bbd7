"""Central ingest: exactly-once batches from many agents, committed in groups.

Every batch carries (node, stream, seq). Its samples and its id are committed in one DuckDB
transaction, so a batch the agent resends after a lost acknowledgement is recognised and
acknowledged again without being stored twice. Requests are queued and committed in groups
(group commit): DuckDB pays its per-statement and per-commit cost once per group, not once
per node or batch. The unit queued is the request, not the batch: an agent draining a
backlog sends up to 360 batches in one body, and per-request work is done once per body.

Two threads. The screener takes whatever requests queued up (in a burst, enough for one or
two DuckDB row groups) and screens their rows (analytics/ingest_screen.py: checks that need
nothing from the store); the writer drops batches and samples already stored, inserts and
commits. The screener prepares the next group while DuckDB commits the last one: +8% on a
backlog drain on two cores (benchmarks/ingest.py). It did nothing while the HTTP thread still
built an answer object per batch: the three threads only took CPU from each other.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuledger.analytics.store import failpoints
from gpuledger.analytics.store.access import Audit
from gpuledger.analytics.store.batch_ids import BatchRuns, runs_of
from gpuledger.analytics.store.database import Store, conform
from gpuledger.analytics.store.gpu_inventory import MODEL_MISMATCH, REGISTER_WINDOW_S, GpuInventory, Verdict
from gpuledger.analytics.store.job_claims import (JOB_NOT_ON_NODE, TEAM_NOT_IN_POOL, misplaced, outside_pool,
                                                   without_claim)
from gpuledger.analytics.store.gpu_time import MAX_DECLARED_INTERVAL_S, OVERLAPS, conserve
from gpuledger.analytics.store.ingest_screen import (
    BATCH,
    HOLDER,
    INSTANT,
    MAX_GPUS_PER_NODE,
    IngestRequest,
    InvalidBatch,
    ScreenedGroup,
    count_reasons,
    counts_per_batch,
    gpus_of,
    prepare,
    screen_group,
)
from gpuledger.analytics.store.metrics import (
    BATCHES_WRITTEN,
    INGEST_COMMIT_SECONDS,
    INGEST_DUPLICATE_BATCHES,
    INGEST_REQUESTS_DEFERRED,
    INGEST_ROWS_CLIPPED,
    INGEST_ROWS_HELD,
    INGEST_ROWS_REJECTED,
    INGEST_ROWS_UNATTRIBUTED,
    INGEST_SECONDS_CLIPPED,
    INGEST_VALUES_NULLED,
    NODE_LAST_SUCCESS,
    ROW_RATE,
    ROWS_WRITTEN,
)
from gpuledger.collector.errors import NotFoundError, UnavailableError
from gpuledger.collector.gpu_catalog import UNKNOWN_MODEL
from gpuledger.collector.samples import SAMPLE_SCHEMA
from gpuledger.collector.wire import DUPLICATE, STORED, batch_answer, multi_batch_answer

__all__ = ["IngestResult", "IngestWriter", "InvalidBatch", "RequestResult", "StoreUnavailable"]
log = logging.getLogger(__name__)
RUNS_SCHEMA = pa.schema([("node", pa.string()), ("stream", pa.string()), ("first_seq", pa.int64()),
                         ("last_seq", pa.int64()), ("rows", pa.int64()), ("rejected", pa.int64())])


class StoreUnavailable(UnavailableError):
    """A group could not be committed (a full disk, an I/O error): nothing of it is stored; agents resend later (503
    with Retry-After, which the agent honours)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the server could not store this batch, nothing of it was kept; resend later: {reason}")


def deferral_reason(exc: BaseException) -> str:
    """A metric label for why a commit failed."""
    text = str(exc).lower()
    return "disk_full" if "no space left" in text or "disk quota" in text else "store_error"


@dataclass
class IngestResult:
    status: str  # STORED | DUPLICATE
    rows: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    nulled_values: int = 0


@dataclass
class RequestResult:
    """What became of each batch of one request, kept as lists: a backlog request holds hundreds of batches,
    and an object per batch was a tenth of the writer's time. Iterating gives an IngestResult per batch."""
    first_seq: int
    fresh: list[bool]  # False: already stored, acknowledged as a duplicate
    rows: list[int]  # rows stored
    nulled: list[int]  # NaN/Inf values stored as NULL
    rejected: dict[int, dict[str, int]]  # refused rows by reason, by position, for the batches that had any

    def __len__(self) -> int:
        return len(self.fresh)

    def __getitem__(self, i: int) -> IngestResult:
        if not self.fresh[i]:
            return IngestResult(DUPLICATE)
        return IngestResult(STORED, self.rows[i], self.rejected.get(i, {}), self.nulled[i])

    def __iter__(self) -> Iterator[IngestResult]:
        return (self[i] for i in range(len(self)))

    def answer(self) -> dict[str, Any]:
        """The JSON answer (collector/wire.py): one batch's result, or, for several, lists over the batches."""
        if len(self) == 1:
            one = self[0]
            return batch_answer(one.status == STORED, one.rows, one.rejected, one.nulled_values)
        return multi_batch_answer(self.first_seq, self.fresh, self.rows, self.rejected, self.nulled)


def use_cross_thread_allocator() -> None:
    """Allocate Arrow buffers with jemalloc (or the system malloc), not pyarrow's default mimalloc.

    Process-wide, so the process that receives agents' pushes calls it once at start (`gpuledger
    serve`), not the writer: a library object must not swap the allocator under its host.

    Ingest decodes a body in the HTTP thread and frees it in another thread. With mimalloc
    that pattern made decoding ~3x and the group-by ~2x slower here, and a backlog drain used
    ~25% more CPU in all (measured with benchmarks/ingest.py and ARROW_DEFAULT_MEMORY_POOL).
    """
    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc
        pool = pa.system_memory_pool()
    pa.set_memory_pool(pool)


ROW_GROUP_ROWS = 122_880  # DuckDB's row group
BURST_ROWS = 8_192  # a group this big means agents are draining backlogs, not trickling
BURST_TARGET_ROWS = ROW_GROUP_ROWS * 3 // 2 + 1  # leaves a partial row group of over half: two cannot merge
MAX_GROUP_ROWS = 2 * ROW_GROUP_ROWS


class IngestWriter:
    def __init__(self, store: Store, max_future_s: float = 300.0, max_age_days: float | None = None,
                 idle_checkpoint_s: float = 1.0, burst_linger_s: float = 1.0, burst_gap_s: float = 0.05,
                 max_gpus_per_node: int = MAX_GPUS_PER_NODE, register_window_s: float = REGISTER_WINDOW_S,
                 max_interval_s: float = MAX_DECLARED_INTERVAL_S,
                 pool_teams: dict[str, tuple[str, ...]] | None = None) -> None:
        """The ingest defaults, each a bound on what an agent may write: `max_future_s` (the newest instant a row
        may have past now), `max_age_days` (the oldest), `max_gpus_per_node` (distinct GPUs one batch may report,
        and GPUs a node may register), `register_window_s` (how long after its first report a node registers
        the GPUs it sends: analytics/store/gpu_inventory.py) and `max_interval_s` (the longest interval a request
        may declare), `pool_teams` (the teams each node pool's agents may bill: analytics/store/job_claims.py);
        the per-row value bounds are analytics/store/ingest_screen.py's, the rule that no GPU instant is billed
        twice analytics/store/gpu_time.py's."""
        self.store = store
        # the audit log a push's entry is committed to, in the same transaction as its batches (set by the API):
        # a push whose batches are stored always has its entry, even after a kill -9 right after the answer
        self.audit: Any = None
        self.max_gpus_per_node = max_gpus_per_node
        self.inventory = GpuInventory(register_window_s, max_gpus_per_node)
        self.max_interval_s = max_interval_s
        self.pool_teams = dict(pool_teams or {})  # [pool_teams]: the teams each node pool's agents may bill
        # the writer's commits and an admin's move of a GPU (assign) change the inventory one at a time
        self._commit_lock = threading.Lock()
        self.max_future = timedelta(seconds=max_future_s)
        # by default the raw retention: a sample older than that could not be refolded into its rollups
        self.max_age = timedelta(days=max_age_days if max_age_days is not None else store.retention.raw_days)
        self.idle_checkpoint_s = idle_checkpoint_s
        self.burst_linger_s = burst_linger_s  # the longest a burst's group is held open
        self.burst_gap_s = burst_gap_s  # a burst is over when no request came for this long
        with store.transaction() as cur:
            self.stored_batches = BatchRuns.load(cur)
            self.inventory.load(cur)
        self._queue: queue.Queue[IngestRequest | None] = queue.Queue()
        self._carry: IngestRequest | None = None  # taken from the queue but left for the next group
        # screened groups waiting for the writer: one, so the next group is screened while DuckDB commits
        self._screened: queue.Queue[ScreenedGroup | None] = queue.Queue(maxsize=1)
        self._handed = self._written = 0  # groups handed to the writer, and groups it has finished
        self._writer_done = threading.Condition()
        store.note_backlog()  # a backlog left by a crash or an import is folded from the first idle moment on
        self._threads = [threading.Thread(target=self._screen_loop, name="ingest-screener", daemon=True),
                         threading.Thread(target=self._write_loop, name="ingest-writer", daemon=True)]
        for thread in self._threads:
            thread.start()

    def enqueue(self, node: str, stream: str, first_seq: int, count: int, interval_s: float,
                table: pa.Table, audit: Any = None) -> Future:
        """Queue one request body of `count` consecutive batches; the future gives its RequestResult.

        Raises InvalidBatch at once (before queueing) when the body cannot be stored at all, or declares an
        interval over `max_interval_s` (every row may claim about its request's interval: ingest_screen.py).
        """
        if not 0 < interval_s <= self.max_interval_s:
            raise InvalidBatch(f"X-Gpuledger-Interval {interval_s:g} s is over this server's limit of "
                               f"{self.max_interval_s:g} s ([ingest] max_interval_s in its config)")
        request = IngestRequest(node, stream, first_seq, count, interval_s, prepare(table, node, first_seq, count),
                                audit=audit)
        self._queue.put(request)
        return request.future

    def submit(self, node: str, stream: str, first_seq: int, count: int, interval_s: float, table: pa.Table,
               timeout_s: float = 120.0) -> RequestResult:
        return self.enqueue(node, stream, first_seq, count, interval_s, table).result(timeout=timeout_s)

    def stop(self) -> None:
        self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=30)

    def _screen_loop(self) -> None:
        while True:
            first = self._carry if self._carry is not None else self._queue.get()
            self._carry = None
            if first is None:
                self._screened.put(None)
                return
            if first.count == 1:  # steady state: what queues while the writer commits makes one group, not two
                with self._writer_done:
                    self._writer_done.wait_for(lambda: self._written == self._handed)
            group = self._gather(first)
            try:
                screened = screen_group(group, datetime.now(timezone.utc), self.max_future, self.max_age,
                                        self.max_gpus_per_node)
            except Exception as exc:  # nothing of the group was stored; every agent will retry
                log.exception("screening %d request(s) failed", len(group))
                INGEST_REQUESTS_DEFERRED.labels(reason="screen_error").inc(len(group))
                for request in group:
                    request.future.set_exception(StoreUnavailable(str(exc)))
                continue
            with self._writer_done:
                self._handed += 1
            self._screened.put(screened)

    def _write_loop(self) -> None:
        while True:
            try:
                # while a backlog is left to fold, an idle moment is a short one: fold the next step soon
                group = self._screened.get(timeout=0.05 if self.store.fold_behind else self.idle_checkpoint_s)
            except queue.Empty:  # idle: the moment to fold the WAL into the file, not mid-burst
                self._fold_if_due()
                try:
                    self.store.checkpoint_if_due()
                except Exception:  # e.g. a full disk: the WAL stays, the next idle moment tries again
                    log.exception("checkpoint failed; retrying when idle again")
                continue
            if group is None:
                return
            try:
                results = self._commit(group)
            except Exception as exc:  # nothing of the group was stored; every agent will retry
                log.error("ingest of %d request(s) failed, nothing of them stored, agents will resend: %s",
                          len(group.requests), exc, exc_info=not isinstance(exc, duckdb.Error))
                INGEST_REQUESTS_DEFERRED.labels(reason=deferral_reason(exc)).inc(len(group.requests))
                for request in group.requests:
                    request.future.set_exception(StoreUnavailable(str(exc)))
                continue
            finally:
                with self._writer_done:
                    self._written += 1
                    self._writer_done.notify_all()
            for request, result in zip(group.requests, results):
                request.future.set_result(result)
            self._fold_if_due()

    def _fold_if_due(self) -> None:
        """Fold closed minutes into the rollups; a failure is logged and retried at the next due moment (the
        samples are stored, and readers aggregate the unfolded tail from them meanwhile)."""
        try:
            self.store.fold_if_due()
        except Exception:
            log.exception("folding rollups failed; retrying later")

    def _gather(self, first: IngestRequest) -> list[IngestRequest]:
        """A group: whatever queued up while the last group was committed; in a burst, 1.5 to 2 row groups.

        A transaction of at least one DuckDB row group is written straight to the file, skipping the
        WAL; a smaller one goes through the WAL and is folded in at the next checkpoint. Each commit
        also leaves a partial row group, which DuckDB compacts with its neighbours at the checkpoint;
        groups of over 1.5 row groups leave fewer, bigger partials. So while requests keep coming
        (a burst: a multi-batch request, or over BURST_ROWS rows queued) the group is held open up to
        `burst_linger_s`; a trickle of single batches (steady state) is never held back.
        """
        group, rows, deadline = [first], first.table.num_rows, None
        backlog = first.count > 1  # an agent draining a backlog: after an outage, all of them are
        while rows < BURST_TARGET_ROWS:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                if rows < BURST_ROWS and not backlog:
                    break
                # a burst: keep gathering while requests keep coming, for a bounded time
                deadline = deadline or time.monotonic() + self.burst_linger_s
                wait = min(self.burst_gap_s, deadline - time.monotonic())
                try:
                    item = self._queue.get(timeout=max(0.0, wait))
                except queue.Empty:
                    break
            if item is None:
                self._queue.put(None)
                break
            if rows + item.table.num_rows > MAX_GROUP_ROWS:
                self._carry = item  # first of the next group
                break
            group.append(item)
            rows += item.table.num_rows
            backlog = backlog or item.count > 1
        return group

    def _fresh_batches(self, group: ScreenedGroup) -> tuple[np.ndarray, BatchRuns]:
        """Which batches are new: not stored before and not earlier in this group."""
        is_fresh, fresh = np.ones(group.count, bool), BatchRuns()
        for request, b in zip(group.requests, group.base):
            last = request.first_seq + request.count - 1
            known = set(self.stored_batches.known(request.key, request.first_seq, last))
            known.update(fresh.known(request.key, request.first_seq, last))
            if not known:  # the usual case
                fresh.add(request.key, request.first_seq, last)
                continue
            for seq in known:
                is_fresh[b + seq - request.first_seq] = False
            fresh.add_ids(request.key, (s for s in range(request.first_seq, last + 1) if s not in known))
        return is_fresh, fresh

    def _commit(self, group: ScreenedGroup) -> list[RequestResult]:
        """Store a screened group in one transaction; a result per batch of each request."""
        started = time.perf_counter()
        is_fresh, fresh = self._fresh_batches(group)
        stored = np.zeros(group.count, np.int64)
        rejected: dict[int, dict[str, int]] = {}
        entries = [(r.audit, group.now) for r in group.requests if r.audit is not None] if self.audit else []
        with self._commit_lock, self.audit.joined() if entries else nullcontext() as write_audit:
            if not is_fresh.any() and write_audit is not None:  # only resent batches: the pushes still have entries
                with self.store.transaction() as cur:
                    write_audit(cur, entries)
            verdict = self._commit_fresh(group, is_fresh, stored, rejected,
                                         (lambda cur: write_audit(cur, entries)) if write_audit is not None else None)
            if verdict is not None:
                self.inventory.committed(verdict, group.now)
        self.stored_batches.merge(fresh)
        results = self._results(group, is_fresh, stored, rejected)
        self._account(group, results, time.perf_counter() - started)
        return results

    def _commit_fresh(self, group: ScreenedGroup, is_fresh: np.ndarray, stored: np.ndarray,
                      rejected: dict[int, dict[str, int]], write_audit: Any) -> Verdict | None:
        """The fresh batches' rows, ids, refusals and held rows in one transaction (with the pushes' audit entries
        when `write_audit` is given); fills `stored` and `rejected` in place; the inventory's verdict, to take
        into the writer's copy once committed."""
        if not is_fresh.any():
            return None
        rows = group.rows
        if not is_fresh.all() and rows.num_rows:
            rows = rows.filter(pa.array(is_fresh).take(rows[BATCH]))
        rejected.update({b: dict(reasons) for b, reasons in group.rejected.items() if is_fresh[b]})
        verdict, held = None, None
        if rows.num_rows:
            verdict = self.inventory.judge(rows, group.gpus if group.gpus is not None else gpus_of(rows), group.now)
            keep = None  # both masks are of the rows as judged: filtered once, at the end
            if verdict.held is not None:
                is_held = pc.is_valid(verdict.held)
                count_reasons(rejected, rows[BATCH], verdict.held)
                held = rows.filter(is_held).drop_columns([BATCH])
                held = held.append_column("held_reason", verdict.held.filter(is_held)).append_column(
                    "held_at", pa.repeat(pa.scalar(group.now, pa.timestamp("us", tz="UTC")), held.num_rows))
                for reason, count in zip(*np.unique(verdict.held.filter(is_held).to_numpy(zero_copy_only=False),
                                                    return_counts=True)):
                    INGEST_ROWS_HELD.labels(reason=reason).inc(int(count))
                keep = pc.invert(is_held)
            if verdict.mismatched is not None:
                wrong = verdict.mismatched if keep is None else pc.and_(verdict.mismatched, keep)
                count_reasons(rejected, rows[BATCH], pc.if_else(wrong, pa.scalar(MODEL_MISMATCH),
                                                                pa.scalar(None, pa.string())))
                keep = pc.invert(wrong) if keep is None else pc.and_(keep, pc.invert(wrong))
            if keep is not None:
                rows = rows.filter(keep)
        with self.store.transaction() as cur:
            if verdict is not None:
                self.inventory.commit(cur, verdict, group.now, held)
            if rows.num_rows:
                rows = self._vouched(cur, rows)
                stored[:] = self._insert_samples(cur, rows, group.count, rejected, self._request_nodes(group),
                                                 latest_end=group.now)
            refused = np.zeros(group.count, np.int64)
            for batch, reasons in rejected.items():
                refused[batch] = sum(reasons.values())
            # a key seen twice in the group, or already stored, is refused as a duplicate sample
            repeats = group.received - stored - refused
            for batch in np.flatnonzero(is_fresh & (repeats > 0)):
                rejected.setdefault(int(batch), {})["duplicate_sample"] = int(repeats[batch])
            self._record_batches(cur, group, is_fresh, stored, group.received - stored)
            if write_audit is not None:
                write_audit(cur)
            failpoints.pause("group_commit")
        return verdict

    def _vouched(self, cur, rows: pa.Table) -> pa.Table:
        """The rows with the claims nobody vouches for taken off (analytics/store/job_claims.py): a job its
        scheduler places on other nodes, a team the node's pool may not bill ([pool_teams])."""
        for reason, wrong in ((JOB_NOT_ON_NODE, misplaced(cur, rows)),
                              (TEAM_NOT_IN_POOL, outside_pool(cur, rows, self.pool_teams))):
            if wrong is None:
                continue
            count = int(pc.sum(wrong).as_py())
            INGEST_ROWS_UNATTRIBUTED.labels(reason=reason).inc(count)
            named = sorted({str(v) for v in rows["job_id" if reason == JOB_NOT_ON_NODE else "team"].filter(wrong)
                            .to_pylist()})
            log.warning("%d row(s) from %s stored as unattributed (%s): %s", count,
                        ", ".join(sorted(set(rows["node"].filter(wrong).to_pylist())))[:200], reason,
                        ", ".join(named[:5]))
            rows = without_claim(rows, wrong)
        return rows

    @staticmethod
    def _request_nodes(group: ScreenedGroup) -> np.ndarray:
        """The node of each batch of the group (a request's batches are all its node's)."""
        nodes = np.empty(group.count, object)
        for request, b in zip(group.requests, group.base):
            nodes[b:b + request.count] = request.node
        return nodes

    def _insert_samples(self, cur, rows: pa.Table, count: int, rejected: dict[int, dict[str, int]],
                        batch_nodes: np.ndarray, all_near: bool = False,
                        latest_end: datetime | None = None) -> np.ndarray:
        """Insert the rows not already stored, held to the rule that no GPU instant is billed twice
        (gpu_time.conserve: overlapping instants clipped or refused, counted in `rejected`); rows stored per
        batch (`count` batches, `batch_nodes` the node of each; `all_near`: look up every row's stored neighbours,
        not only those near their node's newest sample, for rows that another node may have billed). No row bills
        past `latest_end` (default now) plus `max_future` (the clock skew a row's instant may have): a sample
        stands for the interval after it, but a row dated 5 minutes ahead with a 10-minute interval bills at most
        to the edge of that skew, and the time it takes then is not billed again."""
        marks = self._latest_marks(cur, batch_nodes)
        ts = pc.cast(rows["ts"], pa.int64())
        mark_of_row = pa.array(marks).take(rows[BATCH])
        suspects = pc.less_equal(ts, mark_of_row)
        if pc.any(suspects).as_py():
            rows = rows.filter(pc.invert(self._already_stored(cur, rows, suspects)))
            ts, mark_of_row = pc.cast(rows["ts"], pa.int64()), pa.array(marks).take(rows[BATCH])
        # rows whose span may meet a stored one: up to the longest interval after their node's newest sample
        near = pc.less_equal(ts, pc.add(mark_of_row, int(self.max_interval_s * 1_000_000) + 1_000_000))
        near = np.ones(rows.num_rows, bool) if all_near else near.to_numpy(zero_copy_only=False)
        until = latest_end or datetime.now(timezone.utc)
        limit = np.full(rows.num_rows, int((until + self.max_future).timestamp() * 1_000_000), np.int64)
        kept = conserve(rows, cur, near, self.max_interval_s, limit)
        if kept.refused is not None:
            refused_batches = rows[BATCH].filter(pa.array(kept.refused))
            count_reasons(rejected, refused_batches, pa.repeat(pa.scalar(OVERLAPS), len(refused_batches)))
        if kept.clipped_rows:
            INGEST_ROWS_CLIPPED.inc(kept.clipped_rows)
            INGEST_SECONDS_CLIPPED.inc(kept.clipped_seconds)
        rows = kept.rows
        if rows.num_rows:
            cur.register("incoming_samples", rows.drop_columns([BATCH]))
            cur.execute("INSERT INTO samples BY NAME SELECT * FROM incoming_samples")
            cur.unregister("incoming_samples")
            self.store.refold_late(cur, rows)  # rows for minutes already folded: their rollups, in this transaction
            self.store.note_latest(rows, cur)
        return counts_per_batch(rows[BATCH], count)

    def _latest_marks(self, cur, batch_nodes: np.ndarray) -> np.ndarray:
        """Each batch's node's newest stored sample instant (µs; the lowest int64 where the node has none): only
        rows at or before it can repeat a stored one. Agents send in time order, so usually none are."""
        latest = self.store.latest_sample_ts(cur)
        marks = np.full(len(batch_nodes), np.iinfo(np.int64).min // 2, np.int64)
        for i, node in enumerate(batch_nodes):
            mark = latest.get(node)
            if mark is not None:
                marks[i] = int(mark.timestamp() * 1_000_000)
        return marks

    # --- an admin's move of a GPU ------------------------------------------------------------------------------
    def assign(self, gpu: str, node: str, actor: str, model: str | None = None,
               audit: Audit | None = None) -> dict[str, Any]:
        """Register `gpu` to `node` (an admin's decision; `audit`'s entry commits in the same transaction) and store
        the rows of it that `node` sent and were held, under the same rules as a push. What was done. NotFoundError
        for a node that never pushed (a typo would move a GPU to nowhere)."""
        now = datetime.now(timezone.utc)
        with self._commit_lock, audit.log.joined(notable=True) if audit else nullcontext() as write_audit:
            with self.store.transaction() as cur:
                if not self.inventory.known_node(cur, node):
                    raise NotFoundError(f"no agent has pushed as node {node!r}: a GPU is moved to a node that "
                                        "reports (see GET /v1/nodes)")
                before, registered = self.inventory.assign(cur, gpu, node, actor, now, model)
                done = {"gpu_uuid": gpu, "node": node, "previous_node": before, "gpu_model": registered.model,
                        **self._release(cur, gpu, node, registered.model, now)}
                if write_audit is not None:
                    write_audit(cur, [(replace(audit.entry, detail={**(audit.entry.detail or {}), **done}), now)])
        self.inventory.assigned(gpu, registered, now)
        if audit is not None and audit.on_commit is not None:
            audit.on_commit()
        return done

    def register_hardware(self, node: str, gpus: list[tuple[str, str | None]]) -> dict[str, list[str]]:
        """The GPUs a node's agent read from its own hardware (POST /v1/topology), registered to it where free and
        its registration is open (analytics/store/gpu_inventory.py); by outcome."""
        now = datetime.now(timezone.utc)
        with self._commit_lock, self.store.transaction() as cur:
            done = self.inventory.register_hardware(cur, node, gpus, now)
        self.inventory.hardware_registered(node, gpus, done, now)
        if done["elsewhere"] or done["closed"]:
            log.warning("node %s reports GPU(s) registered to another node (%s) or past its registration (%s)",
                        node, ", ".join(done["elsewhere"][:5]) or "none", ", ".join(done["closed"][:5]) or "none")
        return done

    def _release(self, cur, gpu: str, node: str, model: str | None, now: datetime) -> dict[str, Any]:
        """Store the held rows `node` sent of `gpu`; those of another known model than `model` stay held, now as
        `model_mismatch`."""
        rows = cur.execute("SELECT * EXCLUDE (held_reason, held_at) FROM held_samples WHERE gpu_uuid = ? AND node = ? "
                           "AND (? IS NULL OR gpu_model IN (?, ?)) ORDER BY ts",
                           [gpu, node, model, model, UNKNOWN_MODEL]).arrow()
        rows = rows.read_all() if hasattr(rows, "read_all") else rows
        refused: dict[int, dict[str, int]] = {}
        released = 0
        if rows.num_rows:
            rows = conform(rows, SAMPLE_SCHEMA).append_column(BATCH, pa.array(np.zeros(rows.num_rows, np.int64)))
            released = int(self._insert_samples(cur, rows, 1, refused, np.array([node], object), all_near=True,
                                                latest_end=now)[0])
            cur.execute("DELETE FROM held_samples WHERE gpu_uuid = ? AND node = ? "
                        "AND (? IS NULL OR gpu_model IN (?, ?))", [gpu, node, model, model, UNKNOWN_MODEL])
        cur.execute("UPDATE held_samples SET held_reason = ? WHERE gpu_uuid = ? AND node = ?",
                    [MODEL_MISMATCH, gpu, node])
        return {"released_rows": released, "refused_rows": refused.get(0, {}),
                "still_held_rows": cur.execute("SELECT count(*) FROM held_samples WHERE gpu_uuid = ? AND node = ?",
                                               [gpu, node]).fetchone()[0]}

    @staticmethod
    def _already_stored(cur, rows: pa.Table, suspects: pa.Array) -> pa.Array:
        """Which rows (of the suspects) have the same node, GPU, MIG instance, instant and holder as a stored
        sample (ingest_screen.KEY: a GPU's sharers at one instant are each a sample)."""
        keys = rows.select([*INSTANT, *HOLDER]).append_column("_row", pa.array(np.arange(rows.num_rows, dtype=np.int64))
                                              ).filter(suspects)
        cur.register("incoming_keys", keys)
        try:
            found = cur.execute("""
                SELECT k._row FROM incoming_keys k
                WHERE EXISTS (SELECT 1 FROM samples s
                              WHERE s.ts BETWEEN $lo AND $hi AND s.ts = k.ts AND s.node = k.node
                                AND s.gpu_uuid = k.gpu_uuid
                                AND coalesce(s.mig_instance, -1) = coalesce(k.mig_instance, -1)
                                AND s.namespace IS NOT DISTINCT FROM k.namespace
                                AND s.pod IS NOT DISTINCT FROM k.pod
                                AND s.container IS NOT DISTINCT FROM k.container
                                AND s.job_id IS NOT DISTINCT FROM k.job_id)""",
                                {"lo": pc.min(keys["ts"]).as_py(), "hi": pc.max(keys["ts"]).as_py()}).fetchall()
        finally:
            cur.unregister("incoming_keys")
        stored = np.zeros(rows.num_rows, bool)
        stored[[r[0] for r in found]] = True
        return pa.array(stored)

    @staticmethod
    def _record_batches(cur, group: ScreenedGroup, is_fresh: np.ndarray, stored: np.ndarray,
                        rejected: np.ndarray) -> None:
        """The fresh batches' ids, committed with their samples (a row per run), and each node's last-seen time."""
        runs: dict[str, list] = {"node": [], "stream": [], "first_seq": [], "last_seq": [], "rows": [], "rejected": []}
        nodes: dict[str, list] = {}  # node -> [interval_s, batches, rows]
        for request, b in zip(group.requests, group.base):
            fresh = np.flatnonzero(is_fresh[b:b + request.count])
            if not len(fresh):
                continue
            for lo, hi in runs_of(fresh.tolist()):
                runs["node"].append(request.node)
                runs["stream"].append(request.stream)
                runs["first_seq"].append(request.first_seq + lo)
                runs["last_seq"].append(request.first_seq + hi)
                runs["rows"].append(int(stored[b + lo:b + hi + 1].sum()))
                runs["rejected"].append(int(rejected[b + lo:b + hi + 1].sum()))
            totals = nodes.setdefault(request.node, [0.0, 0, 0])
            totals[0] = request.interval_s  # the latest request's interval wins
            totals[1] += len(fresh)
            totals[2] += int(stored[b:b + request.count].sum())
        cur.register("incoming_runs", pa.table(runs, schema=RUNS_SCHEMA))
        cur.execute("INSERT INTO ingest_runs SELECT *, ? FROM incoming_runs", [group.now])
        cur.unregister("incoming_runs")
        cur.register("incoming_nodes", pa.table({"node": list(nodes), "interval_s": [v[0] for v in nodes.values()],
                                                 "batches": [v[1] for v in nodes.values()],
                                                 "rows": [v[2] for v in nodes.values()]}))
        # an update and an insert, not ON CONFLICT: the DuckLake backend has no key to conflict on
        cur.execute("""UPDATE nodes SET last_seen = $now, interval_s = i.interval_s,
                           batches = nodes.batches + i.batches,
                           rows = nodes.rows + i.rows
                       FROM incoming_nodes i WHERE nodes.node = i.node""", {"now": group.now})
        cur.execute("""INSERT INTO nodes SELECT node, $now, interval_s, batches, rows FROM incoming_nodes
                       WHERE node NOT IN (SELECT node FROM nodes)""", {"now": group.now})
        cur.unregister("incoming_nodes")

    @staticmethod
    def _results(group: ScreenedGroup, is_fresh: np.ndarray, stored: np.ndarray,
                 rejected: dict[int, dict[str, int]]) -> list[RequestResult]:
        fresh, rows, nulled = is_fresh.tolist(), stored.tolist(), group.nulled.tolist()
        by_request: list[dict[int, dict[str, int]]] = [{} for _ in group.requests]
        starts = np.array(group.base)
        for batch, reasons in rejected.items():
            r = int(np.searchsorted(starts, batch, side="right")) - 1
            by_request[r][batch - group.base[r]] = reasons
        return [RequestResult(request.first_seq, fresh[b:b + request.count], rows[b:b + request.count],
                              nulled[b:b + request.count], refused)
                for request, b, refused in zip(group.requests, group.base, by_request)]

    def _account(self, group: ScreenedGroup, results: list[RequestResult], seconds: float) -> None:
        INGEST_COMMIT_SECONDS.observe(seconds)
        stored = batches = 0
        for item, result in zip(group.requests, results):
            fresh = sum(result.fresh)
            if fresh < len(result):
                INGEST_DUPLICATE_BATCHES.inc(len(result) - fresh)
            if not fresh:
                continue
            batches += fresh
            stored += sum(result.rows)
            NODE_LAST_SUCCESS.labels(node=item.node).set(group.now.timestamp())
            for i in sorted(set(result.rejected) | {i for i, n in enumerate(result.nulled) if n}):
                one = result[i]
                for reason, count in one.rejected.items():
                    INGEST_ROWS_REJECTED.labels(reason=reason).inc(count)
                INGEST_VALUES_NULLED.inc(one.nulled_values)
                log.warning("batch %s/%s/%d: stored %d row(s), rejected %s, %d NaN/Inf value(s) stored as NULL",
                            item.node, item.stream[:8], item.first_seq + i, one.rows, dict(one.rejected) or "none",
                            one.nulled_values)
        if stored:
            BATCHES_WRITTEN.inc(batches)
            ROWS_WRITTEN.inc(stored)
        ROW_RATE.add(stored)
