"""The worker's side of an attempt: claim, heartbeat, run, finish, record.

The claim happens before any tool code; a refused claim raises Celery's `Ignore`, so a stale or
redelivered message is acknowledged and dropped without running (S3.2, S3.3). Once the worker's
warm shutdown began (the claim gate, `engine/attempt/shutdown_gate.py`) nothing is claimed: the delivery
raises `Reject(requeue=True)` and its message goes back to the queue for another worker.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery, current_task
from celery.exceptions import Ignore, Reject

from dex_celery.backend_errors import driver_cause, first_line, translate
from dex_celery.engine import tracing
from dex_celery.engine.attempt.approval_claim import Bound, claim_approved
from dex_celery.engine.attempt.hooks import attempt_hooks
from dex_celery.engine.attempt.invoke import invoke_attempt, stored_arguments
from dex_celery.engine.attempt.outcome_writer import OutcomeWriter
from dex_celery.engine.attempt.owners import owner_is_dead_here, owner_string
from dex_celery.engine.attempt.pause_points import PausePoint, pause_at
from dex_celery.engine.attempt.phases import AttemptPhases, Phase, Phases
from dex_celery.engine.attempt.shutdown_gate import ShutdownGate
from dex_celery.engine.counters import count_refused_claim
from dex_celery.engine.steps import Ran, Steps
from dex_celery.engine.task_events import (
    AttemptFailed,
    announce_after_worker_lost,
    retry,
    task_result,
)
from dex_celery.errors import CommitUnconfirmed, DexError, LedgerError
from dex_celery.forks import after_fork
from dex_celery.ledger.durability import claim_shortfall
from dex_celery.ledger.ledger import Cause, Claim, ClaimKind, Ledger, LoseMode, Step, StepKind
from dex_celery.model.effects import traits_of
from dex_celery.model.ids import CallKey, parse_task_id
from dex_celery.settings import Settings
from dex_celery.store.repository import Store
from dex_celery.store.values import Outcome, OutcomeRow, arguments_json
from dex_celery.tools.tool import Tool, ToolContext

log = logging.getLogger("dex_celery.engine.attempt.worker")

#: What a heartbeat may meet on its way to Redis and try again within the lease: the client's
#: connection, time-out and reply errors (a failover's READONLY, OOM: `LedgerError` from the
#: script runner), and the socket's own `OSError`s. Never raised into a tool (`ToolContext`).
TRANSIENT_LEDGER_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, OSError, LedgerError)
#: Seconds before a tool's heartbeat that could not reach Redis is tried again; doubled per try
#: up to `BEAT_RETRY_MAX`, and never past the attempt's lease.
BEAT_RETRY_INITIAL = 0.05
BEAT_RETRY_MAX = 0.5


class HeartbeatPump:
    """One thread per worker process renews the leases of every attempt it runs (S3.4).

    One script call per beat for all running attempts keeps the cost off the per-call path.
    An attempt found fenced (timed out, presumed lost) gets `cancelled` and is no longer renewed;
    while its tool goes on regardless, the pump renews its running lease instead (the repeat
    guard's "may still be running", S5.4) until the worker releases it (`release`).
    """

    def __init__(self, ledger: Ledger, interval: float) -> None:
        self.ledger = ledger
        self.interval = interval
        self._running: dict[str, tuple[str, ToolContext, float]] = {}
        #: Fenced attempts whose tool this process still runs: key -> heartbeat timeout.
        self._fenced: dict[str, float] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        #: When the loop's next beat is due (monotonic clock); set by the loop.
        self._due = float("inf")
        #: Per running key: when the last renewal Redis answered was sent (monotonic clock).
        self._renewed_at: dict[str, float] = {}

    def add(self, key: str, fence: str, ctx: ToolContext, heartbeat_timeout: float) -> None:
        with self._lock:
            self._running[key] = (fence, ctx, heartbeat_timeout)
            # The claim just granted the lease; counting from now is a little generous, by the
            # claim's round trip, and the retry of `beat` stops a delay short of it.
            self._renewed_at[key] = time.monotonic()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="dex-heartbeat", daemon=True
                )
                self._thread.start()
            # This lease needs its first renewal within a third of itself. If the loop's next
            # beat is later than that (it slept on longer leases, or idle), wake it to re-plan;
            # otherwise the planned beat covers it and the loop is left alone.
            late = time.monotonic() + min(self.interval, heartbeat_timeout / 3) < self._due
        if late:
            self._wake.set()

    def remove(self, key: str) -> float:
        """Stop renewing `key`; returns when its lease ends (monotonic clock; now if unknown)."""
        with self._lock:
            entry = self._running.pop(key, None)
            renewed = self._renewed_at.pop(key, None)
        if entry is None or renewed is None:
            return time.monotonic()
        return renewed + entry[2]

    def release(self, key: str) -> None:
        """The attempt's end is in the record (a late result included): a fenced one no longer
        runs, so its running lease goes. Costs nothing for an attempt never fenced."""
        with self._lock:
            was_fenced = self._fenced.pop(key, None) is not None
        if was_fenced:
            try:
                self.ledger.release_running(key)
            except Exception:  # it lapses by itself within a heartbeat timeout
                log.exception("could not release the running lease of %s", key)

    def beat(self, key: str) -> bool:
        """Renew one attempt now (a tool's own heartbeat): True while the attempt is ours.

        False once it was fenced, or once its lease ran out before Redis could be reached (the
        sweeper may then judge it lost, so the tool must not go on as if it held it). A Redis
        fault (a reset connection, a refused one, a time-out, a failover's read-only or
        out-of-memory reply) is never raised to the tool: the renewal is tried again, with a
        short backoff, for as long as the lease lasts (counted from the start of the last renewal
        that Redis answered, so never longer than Redis's own lease).
        """
        with self._lock:
            entry = self._running.get(key)
        if entry is None:
            return False
        delay = BEAT_RETRY_INITIAL
        while True:
            started = time.monotonic()
            try:
                fenced = self.ledger.heartbeat([(key, entry[0])])
            except TRANSIENT_LEDGER_ERRORS as e:
                with self._lock:
                    renewed = self._renewed_at.get(key)
                if renewed is None:  # fenced or finished meanwhile
                    return False
                lapses = renewed + entry[2]
                if time.monotonic() + delay >= lapses:
                    log.warning(
                        "attempt of %s: its lease lapsed while Redis could not be reached (%s); "
                        "the tool is told to stop",
                        key,
                        type(e).__name__,
                    )
                    self._fence({key})
                    return False
                log.info("heartbeat of %s could not reach Redis (%s); trying again", key, e)
                time.sleep(delay)
                delay = min(delay * 2, BEAT_RETRY_MAX)
                continue
            if key in fenced:
                self._fence({key})
                return False
            self._mark_renewed([key], started)
            return True

    def _mark_renewed(self, keys: list[str], started: float) -> None:
        with self._lock:
            for key in keys:
                if key in self._running:
                    self._renewed_at[key] = max(self._renewed_at.get(key, started), started)

    def _fence(self, keys: set[str]) -> None:
        with self._lock:
            for key in keys:
                self._renewed_at.pop(key, None)
                entry = self._running.pop(key, None)
                if entry is not None:
                    self._fenced[key] = entry[2]
                    entry[1].cancel()
                    log.warning("attempt of %s was fenced; the tool is told to stop", key)

    def _interval_locked(self) -> float:
        """A third of the shortest heartbeat timeout among the running attempts' policies, at
        most `interval` (a third of the deployment's); `interval` when nothing runs."""
        leases = [hb for _, _, hb in self._running.values()] + list(self._fenced.values())
        shortest = min(leases, default=None)
        return self.interval if shortest is None else min(self.interval, shortest / 3)

    def _loop(self) -> None:
        """Beat every third of the shortest running lease, counted from the previous beat.

        `add` wakes the loop only when a new attempt's lease is shorter than the planned sleep
        allows; the loop then re-plans from the previous beat rather than from now, so a stream
        of new attempts cannot keep pushing the next beat back.
        """
        last_beat = time.monotonic()
        while True:
            with self._lock:
                self._due = last_beat + self._interval_locked()
                due = self._due
            delay = due - time.monotonic()
            if delay > 0 and self._wake.wait(delay):
                self._wake.clear()
                continue  # re-plan with the attempt just added
            last_beat = time.monotonic()
            with self._lock:
                batch = [(k, fence) for k, (fence, _, _) in self._running.items()]
                fenced = list(self._fenced.items())
            if not batch and not fenced:
                continue
            try:
                if fenced:
                    self.ledger.hold_running(fenced)
                refused = self.ledger.heartbeat(batch) if batch else set()
            except Exception:  # a Redis blip must not kill the thread; the lease has slack
                log.exception("heartbeat failed; trying again at the next beat")
                continue
            self._fence(refused)
            self._mark_renewed([k for k, _ in batch if k not in refused], last_beat)


#: This process's owner string per Celery node name (`owner_id`), built once: it asks the
#: kernel for the pid and its start time. Emptied in a forked child (another pid).
_owners: dict[str, str] = {}
after_fork(_owners.clear)


def owner_id() -> str:
    """The owner of an attempt this process runs (`owners.owner_string`): the Celery node name
    (the worker's name in Flower and `celery inspect`), the pid of the pool process, and where
    that pid counts, e.g. `celery@web-1:4242:9f86d081884c.35120`."""
    request = getattr(current_task, "request", None) if current_task else None
    node = getattr(request, "hostname", None) or socket.gethostname()
    owner = _owners.get(node)
    if owner is None:
        owner = _owners[node] = owner_string(node)
    return owner


class _Fences:
    """Fences of this process's attempts: a random part drawn once per process and a counter,
    unique like a fresh `uuid4` each (a claim compares fences for equality only) without asking
    the kernel for randomness per attempt. A forked child draws its own random part."""

    def __init__(self) -> None:
        self._base = ""
        self._count = itertools.count()
        after_fork(self._reset)

    def _reset(self) -> None:
        self._base = ""
        self._count = itertools.count()

    def next(self) -> str:
        if not self._base:
            self._base = os.urandom(10).hex()
        return f"{self._base}{next(self._count):012x}"


_fences = _Fences()


#: Most times a claim waits out a retry's backoff before it gives up waiting and claims anyway
#: being refused or early again is then the ledger's word.
_EARLY_WAITS = 8
#: Seconds a claim that cannot reach Redis (a reset or refused connection, a failover under
#: way) is tried again before its delivery is handed back to the broker. No tool code has run,
#: and a repeat with the same fence holds as the first (`claim.lua`), so trying again is safe.
CLAIM_RETRY_WINDOW = 30.0
#: What a claim still meets at the end of that window and hands back: Redis out of reach. An
#: error Redis answered with (a failover's READONLY for 30 s, a script's fault) fails the task
#: instead, as before, rather than send the message round again and again.
UNREACHABLE_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    OSError,
)


def claim_attempt(
    ledger: Ledger,
    key: str,
    attempt: int,
    *,
    owner: str,
    fence: str,
    gate: ShutdownGate | None = None,
    tool: str = "*",
) -> Claim | None:
    """Claim, first waiting out a retry's backoff on the ledger's clock (`not_before`). None:
    the worker's shutdown began while the backoff (or Redis) was waited out, and nothing was
    claimed. `tool`: the call's tool, for a write freeze of some tools (S13.2).

    Raises `Reject` (requeue) when Redis stays out of reach for `CLAIM_RETRY_WINDOW`: the
    message goes back to the broker, no tool code ran."""
    claim = _claim_reaching_redis(ledger, key, attempt, owner, fence, gate, tool)
    for _ in range(_EARLY_WAITS):
        if claim is None or claim.kind is not ClaimKind.EARLY:
            break
        if not _sleep(gate, claim.wait):
            return None
        claim = _claim_reaching_redis(ledger, key, attempt, owner, fence, gate, tool)
    return claim


def _claim_reaching_redis(
    ledger: Ledger,
    key: str,
    attempt: int,
    owner: str,
    fence: str,
    gate: ShutdownGate | None,
    tool: str,
) -> Claim | None:
    """`Ledger.claim`, tried again with a short backoff while Redis cannot be reached.

    Raising the client's error instead would fail the Celery task with the call still queued in
    the ledger: nothing would run it again before its queue deadline (the sweeper then ends a
    read late, a write as never run)."""
    give_up = time.monotonic() + CLAIM_RETRY_WINDOW
    delay = BEAT_RETRY_INITIAL
    while True:
        try:
            return ledger.claim(key, attempt, owner=owner, fence=fence, tool=tool)
        except TRANSIENT_LEDGER_ERRORS as e:
            if time.monotonic() + delay >= give_up:
                if not isinstance(e, UNREACHABLE_ERRORS):
                    raise  # Redis answered, with an error: handing back would loop on it
                raise hand_back(
                    key, attempt, f"Redis could not be reached to claim it: {first_line(e)}"
                ) from None
            log.warning(
                "attempt %d of %s: its claim could not reach Redis (%s); trying again",
                attempt,
                key,
                type(e).__name__,
            )
        if not _sleep(gate, delay):
            return None
        delay = min(delay * 2, BEAT_RETRY_MAX)


def _sleep(gate: ShutdownGate | None, seconds: float) -> bool:
    """Sleep, cut short by the worker's shutdown; True while the worker still claims."""
    if gate is not None:
        return gate.sleep(seconds)
    time.sleep(seconds)
    return True


def hand_back(key: str, attempt: int, why: str) -> Reject:
    """What a delivery this worker will not claim raises: Celery puts its message back in the
    queue (the task is acknowledged late), so another worker claims and runs it."""
    log.info("attempt %d of %s handed back to the broker unclaimed: %s", attempt, key, why)
    return Reject(why, requeue=True)


class Worker:
    """The worker's side of every attempt in this process; built once per process (`runtime`).

    Handed its collaborators: the ledger it claims in, the store whose write fence it checks,
    what acts on the steps it wins (`engine/steps.py`), the heartbeat pump and the outcome
    writer.
    """

    def __init__(
        self,
        celery: Celery,
        ledger: Ledger,
        store: Store,
        steps: Steps,
        settings: Settings,
        writer: OutcomeWriter,
        forward: Callable[[OutcomeRow], bool] | None = None,
        gate: ShutdownGate | None = None,
        on_frozen: Callable[[str, Claim], None] | None = None,
    ) -> None:
        self.celery = celery
        self.ledger = ledger
        self.store = store
        self.steps = steps
        self.settings = settings
        self.writer = writer
        #: Hands an outcome to the worker's outcome recorder (prefork: `OutcomeChannel.send`);
        #: False: this process's own writer records it.
        self.forward = forward
        self.pump = HeartbeatPump(ledger, settings.heartbeat_timeout / 3)
        #: Shut when the worker's warm shutdown begins: deliveries are then handed back unclaimed.
        self.gate = gate or ShutdownGate()
        #: Holds or rejects a call whose claim a write freeze refused (`engine/upkeep/freeze.py`).
        self.on_frozen = on_frozen
        #: What watches each attempt from its phases' boundaries (`engine/attempt/hooks.py`).
        self.phases = Phases(attempt_hooks(settings))

    def run(
        self,
        tool: Tool,
        key: str,
        attempt: int,
        arguments: str | dict[str, Any],
        *,
        sealed: str | None,
        approved: bool,
    ) -> str | None:
        """Body of every `dex.tool.<name>` task (how the tool is invoked: `dex_celery.engine.attempt.invoke`).
        Returns the record's summary when the call succeeded and raises `AttemptFailed` (or
        Celery's `Retry`) otherwise, so the task's state in Flower is the record's
        (`dex_celery.engine.task_events`)."""
        # The phases' hooks (tracing, pause points, task events) watch this sequence from the
        # outside: `engine/attempt/phases.py`, `engine/attempt/hooks.py`.
        phases = self.phases.start(key, attempt, tool.name)
        with phases.phase(Phase.ATTEMPT):
            call = CallKey.parse(key)  # a forged message with a malformed key: InvalidId, no claim
            phases.parsed(call.session_id)
            fence = _fences.next()
            bound = Bound(tool, arguments, sealed) if approved else None
            with phases.phase(Phase.ADMIT):
                claim, refused, edit = self._claim(key, attempt, fence, phases, tool.name, bound)
            if refused:
                cause, payload = Cause.RETRYABLE, refused
                lease_until = time.monotonic() + claim.heartbeat_timeout
            else:
                cause, payload, lease_until = self._execute(
                    tool, call, attempt, claim, (arguments, sealed), fence, phases
                )
            try:
                return self._finish(
                    tool, call, attempt, arguments, fence, cause, payload, phases, lease_until, edit
                )
            finally:
                # Only after a late result is in SQL: the guard must never see neither (S5.4).
                self.pump.release(key)

    def _claim(
        self,
        key: str,
        attempt: int,
        fence: str,
        phases: AttemptPhases,
        tool: str,
        bound: Bound | None = None,
    ) -> tuple[Claim, str, str | None]:
        """Claim before any tool code; raise `Ignore` if refused. Returns the claim, the
        replica shortfall's text ('' if none) when the claim does not count (the tool then
        does not run), and the approver's edit of the arguments (an approved call, `bound`,
        S13.3). A claim a write freeze refused (S13.2) holds or rejects the call first. Why a
        delivery is not run goes to `phases` (its hooks trace it and show it in Flower)."""
        owner = owner_id()
        if self.gate.shut_already:
            phases.not_run("handed_back")
            raise hand_back(key, attempt, "the worker is shutting down")
        try:
            with phases.phase(Phase.CLAIM):
                claim = claim_attempt(
                    self.ledger, key, attempt, owner=owner, fence=fence, gate=self.gate, tool=tool
                )
        except Reject:  # Redis stayed out of reach: the message goes back to the broker
            phases.not_run("handed_back")
            raise
        if claim is None:
            phases.not_run("handed_back")
            raise hand_back(key, attempt, "the worker began shutting down before its claim")
        if claim.kind is ClaimKind.FROZEN:
            self._frozen(key, attempt, claim)
            phases.not_run("frozen", claim.reason)
            raise Ignore()
        if not claim.ok:
            log.warning("attempt %d of %s not run: claim refused (%s)", attempt, key, claim.reason)
            count_refused_claim(self.ledger, claim.reason)
            phases.not_run(f"claim_refused:{claim.reason}", claim.reason)
            raise Ignore()
        phases.claimed(claim.effect)
        # With `claim_replicas`, the claim counts only once replicas hold it (WAIT); short of
        # that the tool does not run and the attempt ends as not run (ledger/durability.py).
        # Checked before the write fence, so SQL holds claims only of writes that may then run.
        refused = claim_shortfall(self.ledger.client, self.settings, key, attempt)
        fenced = traits_of(claim.effect).fenced
        edit = None
        if not refused and bound is not None:
            # An approved call: the approval is consumed inside the write fence, bound to this
            # worker's tool and arguments (S13.3, `engine/attempt/approval_claim.py`).
            held = claim_approved(self, bound, key, attempt, fence, owner, fenced)
            if not held.ok:
                phases.not_run("approval_not_bound", "approval")
                raise Ignore()
            edit = held.edit
        elif not refused and fenced and not self._fence_write(key, attempt, fence, owner):
            phases.not_run("write_fence_refused", "write_fence")
            raise Ignore()
        return claim, refused or "", edit

    def _frozen(self, key: str, attempt: int, claim: Claim) -> None:
        """Hold or reject the call whose claim a write freeze refused; if that fails (the
        database is away), the call is `pending` without a ledger entry and the sweeper's orphan
        check opens it again, to meet the freeze again. No tool code runs either way."""
        log.info("attempt %d of %s not run: writes are frozen", attempt, key)
        count_refused_claim(self.ledger, claim.reason)
        if self.on_frozen is None:
            return
        pause_at(PausePoint.BEFORE_HOLD, key)  # tests only
        try:
            self.on_frozen(key, claim)
        except Exception as e:
            log.warning(
                "could not hold %s for the write freeze (%s); the sweeper opens it again",
                key,
                first_line(e),
            )

    def _execute(
        self,
        tool: Tool,
        call: CallKey,
        attempt: int,
        claim: Claim,
        given: tuple[str | dict[str, Any], str | None],
        fence: str,
        phases: AttemptPhases,
    ) -> tuple[Cause, str, float]:
        """Run the tool under this process's heartbeat pump (`invoke_attempt` runs it);
        `given`: the message's arguments and sealed secrets. Returns the ledger's (cause,
        payload) and when the attempt's lease ends (monotonic clock), for `_finish`."""
        pump = self.pump
        arguments, sealed = given
        key = call.key
        limit = claim.start_to_close
        deadline = time.monotonic() + limit if limit > 0 else None
        ctx = ToolContext(call, attempt, beat=lambda: pump.beat(key), deadline=deadline)
        pump.add(key, fence, ctx, claim.heartbeat_timeout)
        try:
            with phases.phase(Phase.RUN):
                cause, payload = invoke_attempt(
                    self.ledger,
                    self.steps,
                    self.settings,
                    tool,
                    ctx,
                    arguments,
                    sealed,
                    start_to_close=claim.start_to_close,
                    effect=claim.effect,
                )
                phases.ran(cause)
        finally:
            lease_until = pump.remove(key)
        return cause, payload, lease_until

    def _finish(
        self,
        tool: Tool,
        call: CallKey,
        attempt: int,
        arguments: str | dict[str, Any],
        fence: str,
        cause: Cause,
        payload: str,
        phases: AttemptPhases,
        lease_until: float,
        edit: str | None = None,
    ) -> str | None:
        """Finish in the ledger and act on the step (`engine/steps.py`: the outcome to the
        writer, the next attempt published, a late result kept), then answer Celery."""
        key = call.key
        with phases.phase(Phase.FINISH):
            step = self._finish_in_ledger(key, attempt, fence, cause, payload, lease_until)
            phases.finished(step)

        def write(outcome: Outcome) -> None:
            # SQL gets it in the next batch of the worker's outcome recorder (prefork), else of
            # this process's own writer.
            shown = arguments_json(stored_arguments(arguments))
            row = OutcomeRow(call, tool.name, shown, outcome, tracing.carrier(), edit)
            if self.forward is None or not self.forward(row):
                self.writer.submit(row)

        acted = self.steps.apply(key, step, ran=Ran(attempt, cause, payload, write))
        if acted.outcome is not None:
            return task_result(acted.outcome)
        if acted.retried:
            raise retry(attempt, payload if cause is not Cause.OK else "")
        if acted.late:
            raise AttemptFailed(
                f"attempt {attempt} finished after the call's outcome was decided; its result "
                "is kept as a late result and changes nothing"
            )
        return None

    def _finish_in_ledger(
        self, key: str, attempt: int, fence: str, cause: Cause, payload: str, lease_until: float
    ) -> Step:
        """`Ledger.finish`, tried again while Redis is briefly away, until the lease ends.

        The tool has run: giving up at the first reset connection would leave its end unreported
        and the lease to lapse into `outcome_unknown`. Repeating is safe: `finish.lua` answers a
        repeat of the same fence's finish with a noop (the sweeper then records the outcome the
        first run left). Past the lease the error is raised as before (the sweeper decides).
        """
        delay = BEAT_RETRY_INITIAL
        while True:
            try:
                return self.ledger.finish(key, attempt, fence=fence, cause=cause, payload=payload)
            except TRANSIENT_LEDGER_ERRORS as e:
                if time.monotonic() + delay >= lease_until:
                    raise
                log.warning(
                    "attempt %d of %s ended, but Redis could not be reached to say so (%s); "
                    "trying again",
                    attempt,
                    key,
                    type(e).__name__,
                )
                time.sleep(delay)
                delay = min(delay * 2, BEAT_RETRY_MAX)

    def _fence_write(self, key: str, attempt: int, fence: str, owner: str) -> bool:
        """The write fence (docs/ledger.md): a write runs only once its claim is committed in
        SQL.

        If SQL refuses (another attempt of this write holds the claim there, or the call has
        ended there), Redis's claim was made on a ledger that went back in time: the attempt is
        given up before any tool code, and, since the write may have run under the other
        claim, it is lost.
        """
        now = self.ledger.now()
        try:
            claimed = self.store.claim_write(key, attempt, fence=fence, owner=owner, now=now)
        except Exception as e:  # the database refused, or broke during the commit
            self.give_up_unconfirmed(key, attempt, fence, e)
            return False
        if claimed:
            return True
        self.refused_by_database(key, attempt, fence)
        return False

    def refused_by_database(self, key: str, attempt: int, fence: str) -> None:
        """The system of record refused this attempt's claim: another claim of the write is
        there, or the call ended there. Given up before any tool code (the write may have run
        under the other claim, so it is lost)."""
        log.warning(
            "attempt %d of %s not run: the database holds another claim of it", attempt, key
        )
        step = self.ledger.lose(
            key,
            attempt,
            mode=LoseMode.RELEASED,
            fence=fence,
            detail=(
                "the database shows this write was claimed before; the ledger had lost that claim"
            ),
        )
        self.steps.apply(key, step)

    def give_up_unconfirmed(self, key: str, attempt: int, fence: str, error: Exception) -> None:
        """The write's claim could not be committed in SQL: give the attempt up, no tool code.

        The ledger ends it `outcome_unknown` with reason `claim_unconfirmed` and a detail that
        says which of the two it was: the claim was never made (no connection, or a failure
        before the COMMIT), or the connection broke during the COMMIT (`CommitUnconfirmed`:
        the claim may exist). Recording it judges from SQL (`Steps.record`): without a
        claim there the call is `failed`, "the tool did not run"; with one, it stays unknown,
        never "lost after the tool started". If the database is still away, the record waits
        in the ledger's unrecorded index and the sweeper writes it once the database answers;
        if Redis is away too, the lease lapses and the sweeper judges it the same way.
        """
        settings = self.settings
        driver_error = driver_cause(error) if isinstance(error, CommitUnconfirmed) else error
        translated = translate(
            driver_error or error,
            redis_url=settings.redis_url,
            database_url=settings.database_url,
        )
        cause = first_line(translated or driver_error or error)
        if isinstance(error, CommitUnconfirmed):
            detail = (
                "the connection to the database broke while the worker committed its claim of "
                f"this write, so it could not tell whether the claim was made: {cause}"
            )
        else:
            detail = (
                "the worker could not commit its claim of this write in the database, so the "
                f"claim was never made: {cause}"
            )
        log.warning("attempt %d of %s not run: %s", attempt, key, detail)
        try:
            step = self.ledger.lose(
                key, attempt, mode=LoseMode.UNCONFIRMED, fence=fence, detail=detail
            )
            self.steps.apply(key, step)
        except Exception as e:  # the database (or Redis) is still away: expected in an outage
            log.warning(
                "could not record yet that attempt %d of %s ran no tool code (%s); the sweeper "
                "will, once the backends answer",
                attempt,
                key,
                first_line(e),
            )

    def on_worker_lost(self, task_id: str, detail: str) -> None:
        """Mark the attempt of a dead pool child lost now (or expired, if it died before its
        claim).

        Only an attempt claimed by a process of this host's PID namespace that is gone is lost
        here (`owners.owner_is_dead_here`): the same attempt delivered twice may have died in one
        process while another runs it, on this host or on another whose process ids (and even
        host name) are the same.
        """
        try:
            call, attempt = parse_task_id(task_id)
        except DexError:
            log.warning("WorkerLostError for a task id that is not ours: %r", task_id)
            return
        entry = self.ledger.read(call.key)
        if entry is None or entry.attempt != attempt:
            return
        if entry.state == "running" and not owner_is_dead_here(entry.owner):
            log.info("attempt %s is running in live process %s; not lost", task_id, entry.owner)
            return
        step = self.ledger.lose(
            call.key,
            attempt,
            mode=LoseMode.WORKER_LOST,
            owner=entry.owner,
            detail=f"the pool process died: {detail}",
        )
        log.warning("pool process running %s died; ledger step: %s", task_id, step.kind.value)
        outcome = self.steps.apply(call.key, step, announce=False).outcome
        if step.kind is not StepKind.NOOP:
            announce_after_worker_lost(self.celery, self.settings, call.key, attempt, step, outcome)
