"""The Redis attempt ledger: every state change of an attempt is one Lua script.

The ledger is where "this attempt reached a worker" is decided (S3.3), atomically and before any
tool code runs, and where each attempt's end decides the call's next step (retry or outcome).
Scripts are compare-and-set: two sweepers, a sweeper and a worker, or a late worker racing over
the same attempt cause exactly one transition. Every time a script compares or stores is Redis's
own (S10.1): no argument carries a host's clock. docs/ledger.md describes the states, the
transitions and what happens when Redis goes back in time.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from typing import Any, Required, TypedDict, Unpack, cast

import redis
from redis.cluster import RedisCluster

from dex_celery.errors import LedgerError
from dex_celery.ledger.attempt_log import AttemptLogEntry, parse_attempt_log
from dex_celery.ledger.events import AgentEvents, newest_position
from dex_celery.ledger.hot import HotScripts
from dex_celery.ledger.keys import KeySpace, ShardKeys
from dex_celery.ledger.protocol import decode
from dex_celery.model.effects import ledger_flags_json
from dex_celery.model.policy import PolicySnapshot


class OpenResult(StrEnum):
    OPENED = "opened"
    EXISTS = "exists"
    EPOCH_CHANGED = "epoch"
    #: A write budget has too little left (S13.1): nothing was opened.
    OVER_BUDGET = "over"
    #: A budget's scope is of another ledger life or gone: count it from SQL, then open again.
    REBUILD = "rebuild"


@dataclass(frozen=True, slots=True)
class OpenReply:
    """What `open_replies` says of one call: the result and, for OVER_BUDGET or REBUILD, which
    of its charges (index) and that scope's totals."""

    result: OpenResult
    budget: int = -1
    reserved: float = 0.0
    spent: float = 0.0
    held: float = 0.0

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> OpenReply:
        result = OpenResult(f["kind"])
        if result is OpenResult.OVER_BUDGET:
            return cls(
                result,
                int(f["budget"]) - 1,
                float(f["reserved"]),
                float(f["spent"]),
                float(f["held"]),
            )
        if result is OpenResult.REBUILD:
            return cls(result, int(f["budget"]) - 1)
        return cls(result)


#: One call's charge as `open` takes it: (scope key, limit, amount, window seconds, force).
BudgetArg = tuple[str, int, int, float, bool]


class StepKind(StrEnum):
    """What the caller of a transition must do next."""

    RETRY = "retry"  # publish attempt `attempt`; its claim waits out the backoff
    FINISHED = "finished"  # write the outcome to SQL, then call `recorded`
    LATE = "late"  # the attempt was fenced: keep the result as evidence only
    NOOP = "noop"  # someone else already moved this attempt


class Cause(StrEnum):
    """Why an attempt ended, as the worker reports it (see `_common.lua`)."""

    OK = "ok"
    TOOL_ERROR = "tool_error"
    RETRYABLE = "retryable"
    TIMED_OUT = "timed_out"
    #: The tool's answer was lost after it may have acted (`ToolLost`); `next_step` treats it as
    #: a lost worker (retry, else failed for a read, else outcome_unknown).
    LOST = "lost"


class LoseMode(StrEnum):
    """How an attempt came to be lost (see `lose.lua`)."""

    LAPSED = "lapsed"  # its lease ran out (the sweeper)
    WORKER_LOST = "worker_lost"  # the pool process that claimed it died (its parent says so)
    RELEASED = "released"  # its worker gave it up: the system of record refused the claim
    #: Its worker gave it up before any tool code: the claim in the system of record could not
    #: be committed, or its commit could not be confirmed (the write fence, `Worker`).
    UNCONFIRMED = "unconfirmed"


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    attempt: int = 0
    delay: float = 0.0
    status: str = ""
    reason: str = ""
    #: The attempt log as JSON (`attempt_log.py`), stored unchanged in SQL.
    log: str = "[]"
    detail: str = ""
    #: The worker's result arrived after the deadline and was kept as evidence only.
    late_result: bool = False
    #: When the ledger decided a FINISHED step's outcome (Redis's clock): the record's
    #: `finished_at`, whenever SQL gets it.
    finished_at: float | None = None

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> Step:
        kind = StepKind(f["kind"])
        late = f.get("late_result") == "1"
        if kind is StepKind.RETRY:
            return cls(kind, attempt=int(f["attempt"]), delay=float(f["delay"]), late_result=late)
        if kind is StepKind.FINISHED:
            return cls(
                kind,
                attempt=int(f["attempt"]),
                status=f["status"],
                reason=f["reason"],
                log=f.get("log") or "[]",
                detail=f.get("detail", ""),
                late_result=late,
                finished_at=float(f["finished_at"]) if f.get("finished_at") else None,
            )
        return cls(kind)


class ClaimKind(StrEnum):
    CLAIMED = "claimed"
    EARLY = "early"  # a retry whose backoff has not passed yet on the ledger's clock
    REFUSED = "refused"
    #: A write freeze holds the call (S13.2): its entry left the ledger; hold or reject it.
    FROZEN = "frozen"


@dataclass(frozen=True, slots=True)
class Claim:
    kind: ClaimKind
    reason: str = ""
    heartbeat_timeout: float = 0.0
    start_to_close: float = 0.0
    effect: str = ""
    wait: float = 0.0
    #: FROZEN: the freeze's JSON (`model/freeze.parse_entry`), and whether an earlier attempt of
    #: the call had reached a worker (a retried idempotent write).
    freeze: str = ""
    reached: bool = False

    @property
    def ok(self) -> bool:
        return self.kind is ClaimKind.CLAIMED


@dataclass(frozen=True, slots=True)
class LedgerCall:
    """A snapshot of one call's ledger entry, for recording and for `calls show`."""

    key: str
    status: str
    attempt: int
    state: str
    effect: str
    reached: bool
    reason: str
    error: str
    result: str | None
    late: str | None
    owner: str
    fence: str
    refused: int
    epoch: str
    log_json: str
    log: tuple[AttemptLogEntry, ...]
    #: When the current attempt was claimed (Redis's clock); None while it waits in the queue.
    claimed_at: float | None = None
    #: When the outcome was decided (Redis's clock); None while the call goes on.
    finished_at: float | None = None
    #: Why the current attempt still waits in the queue, as a worker that handed it back said
    #: (`Ledger.note_waiting`); "" when none did.
    waiting: str = ""

    @classmethod
    def from_hash(cls, key: str, h: dict[str, str]) -> LedgerCall:
        return cls(
            key=key,
            status=h.get("status", ""),
            attempt=int(h.get("n", "0")),
            state=h.get("state", ""),
            effect=h.get("effect", ""),
            reached=h.get("reached") == "1",
            reason=h.get("reason", ""),
            error=h.get("error", "") or h.get("last_detail", ""),
            result=h.get("result"),
            late=h.get("late"),
            owner=h.get("owner", ""),
            fence=h.get("fence", ""),
            refused=int(h.get("refused", "0")),
            epoch=h.get("epoch", ""),
            log_json=h.get("log") or "[]",
            log=parse_attempt_log(h.get("log")),
            claimed_at=float(h["claimed_at"]) if h.get("claimed_at") else None,
            finished_at=float(h["finished_at"]) if h.get("finished_at") else None,
            waiting=h.get("waiting", "") if h.get("waiting_n") == h.get("n") else "",
        )


#: One broker command of a message (command, target key or channel, value) as Kombu's Redis
#: transport would send it: `lpush` to a queue, `pexpire` of one, `publish` of an event.
BrokerCommand = tuple[str, str, str | bytes]


class OpenOptions(TypedDict, total=False):
    """How calls are opened (`Ledger.open_replies`'s keywords, but for write budgets)."""

    epoch: Required[str]
    announce: bool
    may_have_run: bool
    sends: Sequence[Sequence[BrokerCommand]] | None
    passed: float | None


def _load(name: str) -> str:
    return resources.files("dex_celery.ledger").joinpath("scripts").joinpath(name).read_text()


_SCRIPTS = (
    "open",
    "claim",
    "heartbeat",
    "finish",
    "lose",
    "expire",
    "time_out",
    "recorded",
    "rotate",
    "now",
    "note",
    "budget_settle",
    "budget_seed",
    "budget_read",
    "withdraw",
    "freeze",
)
#: Scripts that use none of `_common.lua`'s helpers run without them: Redis runs a script's
#: whole text on every call, helper definitions included (docs/benchmarks.md).
_STANDALONE = frozenset({"recorded", "rotate", "freeze", "budget_seed"})
#: Scripts that reserve, settle, rebuild or read write budgets get `_budget.lua` (S13.1).
_BUDGETED = frozenset({"open", "recorded", "budget_settle", "budget_seed", "budget_read"})


def _script_text(name: str, common: str, budget: str) -> str:
    parts = [] if name in _STANDALONE else [common]
    if name in _BUDGETED:
        parts.append(budget)
    return "\n".join([*parts, _load(f"{name}.lua")])


_STANDALONE = frozenset({"recorded", "rotate", "withdraw", "freeze"})


#: Joins the epochs of a sharded ledger's shards into the one epoch string this process passes
#: around (`LedgerEpoch`); a single shard's epoch is its own, unchanged.
EPOCH_SEPARATOR = ","


def join_epochs(epochs: Sequence[str]) -> str:
    return EPOCH_SEPARATOR.join(epochs)


def shard_epoch(epoch: str, shard: int, shards: int) -> str:
    """The epoch of shard `shard` within the joined epoch of all `shards`."""
    if shards == 1:
        return epoch
    parts = epoch.split(EPOCH_SEPARATOR)
    return parts[shard] if len(parts) == shards else ""


def _budgets_arg(charges: Sequence[BudgetArg]) -> str:
    """`open.lua`'s budgets argument: `[limit, amount, window, force]` per charge, or ''."""
    if not charges:
        return ""
    return json.dumps(
        [[limit, amount, window, int(force)] for _, limit, amount, window, force in charges]
    )


def _n(attempt: int | None) -> str:
    """Attempt number for a script; '' lets the sweeper act on whichever attempt is current."""
    return "" if attempt is None else str(attempt)


class LedgerClock:
    """Redis's time without a round trip per reading.

    One `now.lua` call pins Redis's time to this process's monotonic clock; readings in between
    add the monotonic time elapsed, which no change of the host's wall clock affects. Re-pinned
    every `refresh` seconds (0: every reading asks Redis, as the unit tests that freeze time do).
    """

    def __init__(self, read: Callable[[], float], refresh: float) -> None:
        self._read = read
        self._refresh = refresh
        self._pinned: tuple[float, float] | None = None
        self._lock = threading.Lock()

    def __call__(self) -> float:
        mono = time.monotonic()
        with self._lock:
            pinned = self._pinned
            if pinned is None or mono - pinned[1] >= self._refresh:
                pinned = (self._read(), time.monotonic())
                self._pinned = pinned
        return pinned[0] + (mono - pinned[1]) if mono > pinned[1] else pinned[0]


class Ledger:
    """Typed access to the ledger scripts. One instance per process; thread-safe."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        keys: KeySpace | None = None,
        events_maxlen: int = 100_000,
        finished_ttl: int = 3600,
        jitter: Callable[[], float] = random.random,
        clock_refresh: float = 2.0,
    ) -> None:
        self.client = client
        self.keys = keys or KeySpace()
        self.events_maxlen = events_maxlen
        self.finished_ttl = finished_ttl
        self.jitter = jitter
        #: The AgentEvents stream, the one way events outside the scripts are published.
        self.events = AgentEvents(
            client,
            self.keys.events,
            maxlen=events_maxlen,
            streams=tuple(s.events for s in self.keys.all_shards),
            stream_of=lambda key: self.keys.of(key).events,
        )
        common, budget = _load("_common.lua"), _load("_budget.lua")
        self._scripts = {
            name: client.register_script(_script_text(name, common, budget)) for name in _SCRIPTS
        }
        #: The ledger's clock (Redis's), for the times the Python side writes to SQL.
        self.now = LedgerClock(self._redis_now, clock_refresh)
        #: `claim`, `finish` and `recorded` packed once, on held connections (`ledger/hot.py`);
        #: None for a cluster client, which keeps redis-py's routing.
        self.hot = (
            HotScripts(client, self.keys, self._scripts) if HotScripts.usable(client) else None
        )

    @property
    def may_publish(self) -> bool:
        """Whether `open` may run a broker's commands (`open_many`'s `sends`): only on one
        Redis, not a cluster, since a script's keys must share one slot and a broker's queue
        shares none with the ledger's keys."""
        return self.keys.shards == 1 and not isinstance(self.client, RedisCluster)

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> dict[str, str]:
        try:
            reply = self._scripts[name](keys=list(keys), args=list(args))
        except redis.ResponseError as e:
            raise LedgerError(f"ledger script {name} failed: {e}") from e
        return decode(name, reply)

    def _run_many(
        self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[dict[str, str]]:
        """Several runs of one script in one round trip (a pipeline, not a transaction).

        Plain EVALSHA: redis-py's script-aware pipeline asks `SCRIPT EXISTS` first, a second
        round trip on every batch. A script missing from Redis's cache (after a restart) fails
        every run in the pipeline alike, without running any; it is then loaded and the batch
        sent once more.
        """
        if len(calls) == 1:
            keys, args = calls[0]
            return [self._run(name, keys, args)]
        script = self._scripts[name]
        for _ in range(2):
            pipe = self.client.pipeline(transaction=False)
            for keys, args in calls:
                # EVALSHA by name: a cluster pipeline refuses its `evalsha` method, yet routes
                # the command by its keys (one slot per script, docs/redis.md).
                pipe.execute_command(  # type: ignore[no-untyped-call]
                    "EVALSHA", script.sha, len(keys), *keys, *args
                )
            replies = list(pipe.execute(raise_on_error=False))
            if not any(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
                break
            if not all(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
                raise LedgerError(f"ledger script {name} was missing for part of a batch")
            self.client.script_load(script.script)
        for reply in replies:
            if isinstance(reply, Exception):
                raise LedgerError(f"ledger script {name} failed: {reply}") from reply
        return [decode(name, reply) for reply in replies]

    def _epoch_of(self, epoch: str, shard: ShardKeys) -> str:
        return shard_epoch(epoch, shard.index, self.keys.shards)

    def _ending_keys(self, key: str) -> tuple[str, ...]:
        k = self.keys.of(key)
        return (
            k.call(key),
            k.queue_index,
            k.lease_index,
            k.close_index,
            k.unrecorded_index,
            k.epoch,
            k.clock,
        )

    def _redis_now(self) -> float:
        return float(self._run("now", (self.keys.clock,), ())["now"])

    # --- epoch ----------------------------------------------------------------------------------

    def rotate(
        self,
        *,
        expected_dataset: str,
        dataset: str,
        epoch: str,
        shard: int = 0,
        seen_epoch: str | None = None,
    ) -> tuple[bool, str]:
        """Start a new life of one shard of the ledger (compare-and-set on its dataset marker,
        and on the epoch `seen_epoch` the caller saw, '' for none, when given).

        Returns (whether this call rotated, the shard's epoch in force afterwards).
        """
        s = self.keys.shard(shard)
        args = (expected_dataset, dataset, epoch, *(() if seen_epoch is None else (seen_epoch,)))
        f = self._run("rotate", (s.epoch, s.dataset), args)
        return f["kind"] == "rotated", f["epoch"]

    # --- the write freeze (S13.2) ---------------------------------------------------------------

    def set_freezes(self, freezes: str) -> None:
        """Make every shard's copy of the write freezes hold `freezes` (one JSON object, scope
        -> freeze; '' for none), one atomic script per shard; `claim.lua` of any call then reads
        it (`ledger/freeze.py`)."""
        for shard in self.keys.all_shards:
            self._run("freeze", (shard.freeze,), (freezes,))

    def read_freezes(self) -> list[str | None]:
        """Each shard's copy of the write freezes as it is (one round trip on one Redis)."""
        pipe = self.client.pipeline(transaction=False)
        for shard in self.keys.all_shards:
            pipe.get(shard.freeze)
        return [None if v is None else _text(v) for v in pipe.execute()]

    # --- transitions ----------------------------------------------------------------------------

    def open(
        self,
        key: str,
        snapshot: PolicySnapshot,
        *,
        epoch: str,
        announce: bool = True,
        may_have_run: bool = False,
        passed: float | None = None,
    ) -> OpenResult:
        """Create the call's entry with attempt 1 enqueued.

        `may_have_run`: a lost ledger may have handed this call to a worker already (a reopen
        after Redis went back in time); its attempts then count as having reached one (S4.2,
        S4.3). `passed`: when a person approved the call (the ledger's clock); a write freeze
        begun before then holds it again, one begun later does not (S13.2).
        """
        return self.open_many(
            [(key, snapshot)],
            epoch=epoch,
            announce=announce,
            may_have_run=may_have_run,
            passed=passed,
        )[0]

    def open_many(
        self, calls: Sequence[tuple[str, PolicySnapshot]], **options: Unpack[OpenOptions]
    ) -> list[OpenResult]:
        """`open` for the calls of one turn in one round trip (each open is still atomic); the
        options are `open_replies`'s, but for its write budgets."""
        return [reply.result for reply in self.open_replies(calls, **options)]

    def open_replies(
        self,
        calls: Sequence[tuple[str, PolicySnapshot]],
        *,
        epoch: str,
        announce: bool = True,
        may_have_run: bool = False,
        sends: Sequence[Sequence[BrokerCommand]] | None = None,
        budgets: Sequence[Sequence[BudgetArg]] | None = None,
        passed: float | None = None,
    ) -> list[OpenReply]:
        """`open_many` with write budgets and what each open said of them.

        `epoch` is the ledger's (`LedgerEpoch`); each call is opened under its shard's part.
        `sends`, one sequence per call: the broker's commands of its first attempt's message,
        run by the same script only if it opens the entry (the broker being this Redis:
        `engine/request/publish_capture.py`), so opening and publishing are one atomic step.
        `budgets`, one sequence per call: its charges (S13.1), reserved by the same script
        only if every one has room, so admission and reservation are one atomic step."""
        shards = [self.keys.of(key) for key, _ in calls]
        if budgets is None:
            budgets = [()] * len(calls)
        if sends is None:
            sends = [()] * len(calls)
        elif any(sends) and not self.may_publish:
            raise LedgerError("a sharded or clustered ledger cannot publish in its open script")
        replies = self._run_many(
            "open",
            [
                (
                    (
                        k.call(key),
                        k.queue_index,
                        k.epoch,
                        k.clock,
                        k.events,
                        *(target for _, target, _ in send),
                        *(charge[0] for charge in charged),
                        *((k.dataset,) if charged else ()),
                    ),
                    (
                        key,
                        self._epoch_of(epoch, k),
                        snapshot.effect.value,
                        snapshot.max_attempts,
                        snapshot.backoff_initial,
                        snapshot.backoff_max,
                        snapshot.schedule_to_start,
                        snapshot.start_to_close,
                        snapshot.heartbeat_timeout,
                        self.events_maxlen,
                        "1" if announce else "0",
                        "1" if may_have_run else "0",
                        *snapshot.effect.traits.ledger_flags,
                        _budgets_arg(charged),
                        len(send),
                        *(part for command, _, value in send for part in (command, value)),
                        *(() if passed is None else (repr(float(passed)),)),
                    ),
                )
                for (key, snapshot), k, send, charged in zip(
                    calls, shards, sends, budgets, strict=True
                )
            ],
        )
        return [OpenReply.from_fields(reply) for reply in replies]

    def claim(self, key: str, attempt: int, *, owner: str, fence: str, tool: str = "*") -> Claim:
        """Claim attempt `attempt` of `key` (S3.3); `tool` is the call's tool, for a write
        freeze of some tools (S13.2)."""
        hot = self.hot
        if hot is not None:
            f = hot.run(hot.claim, key, (key, attempt, owner, fence, self.events_maxlen, tool))
        else:
            k = self.keys.of(key)
            f = self._run(
                "claim",
                (
                    k.call(key),
                    k.queue_index,
                    k.lease_index,
                    k.close_index,
                    k.events,
                    k.epoch,
                    k.clock,
                    k.freeze,
                ),
                (key, attempt, owner, fence, self.events_maxlen, tool),
            )
        kind = ClaimKind(f["kind"])
        if kind is ClaimKind.CLAIMED:
            return Claim(
                kind,
                heartbeat_timeout=float(f["heartbeat_timeout"]),
                start_to_close=float(f["start_to_close"]),
                effect=f.get("effect", ""),
            )
        if kind is ClaimKind.EARLY:
            return Claim(kind, wait=float(f["wait"]))
        if kind is ClaimKind.FROZEN:
            return Claim(
                kind,
                reason="frozen",
                effect=f.get("effect", ""),
                freeze=f["freeze"],
                reached=f.get("reached") == "1",
            )
        return Claim(kind, reason=f["reason"])

    def heartbeat(self, running: Sequence[tuple[str, str]]) -> set[str]:
        """Renew leases of `(key, fence)` pairs; return the keys that are fenced.

        One script run per shard (a script touches one shard's slot), in one round trip."""
        if not running:
            return set()
        by_shard: dict[int, list[tuple[str, str]]] = {}
        for key, fence in running:
            by_shard.setdefault(self.keys.shard_of(key), []).append((key, fence))
        groups = list(by_shard.items())
        calls: list[tuple[Sequence[str], Sequence[Any]]] = []
        for shard, pairs in groups:
            k = self.keys.shard(shard)
            args: list[object] = []
            for key, fence in pairs:
                args.extend((key, fence))
            calls.append(
                ((k.lease_index, k.epoch, k.clock, *(k.call(key) for key, _ in pairs)), args)
            )
        fenced: set[str] = set()
        for (_shard, pairs), f in zip(groups, self._run_many("heartbeat", calls), strict=True):
            fenced.update(pairs[int(i) - 1][0] for i in filter(None, f["fenced"].split(",")))
        return fenced

    def finish(self, key: str, attempt: int, *, fence: str, cause: Cause, payload: str) -> Step:
        args = (
            key,
            attempt,
            fence,
            cause.value,
            payload,
            self.jitter(),
            self.events_maxlen,
            ledger_flags_json(),
        )
        hot = self.hot
        if hot is not None:
            return Step.from_fields(hot.run(hot.finish, key, args))
        k = self.keys.of(key)
        keys = (
            k.call(key),
            k.queue_index,
            k.lease_index,
            k.close_index,
            k.unrecorded_index,
            k.events,
            k.epoch,
            k.clock,
        )
        return Step.from_fields(self._run("finish", keys, args))

    def lose(
        self,
        key: str,
        attempt: int | None,
        *,
        mode: LoseMode,
        detail: str,
        owner: str = "",
        fence: str = "",
    ) -> Step:
        f = self._run(
            "lose",
            self._ending_keys(key),
            (
                key,
                _n(attempt),
                mode.value,
                self.jitter(),
                detail,
                owner,
                fence,
                ledger_flags_json(),
            ),
        )
        return Step.from_fields(f)

    def expire(self, key: str, attempt: int | None, *, unpublished: bool, detail: str) -> Step:
        mode = "unpublished" if unpublished else "due"
        f = self._run(
            "expire",
            self._ending_keys(key),
            (key, _n(attempt), mode, self.jitter(), detail, ledger_flags_json()),
        )
        return Step.from_fields(f)

    def time_out(self, key: str, attempt: int | None, *, detail: str) -> Step:
        keys = (*self._ending_keys(key), self.keys.running(key))
        f = self._run(
            "time_out", keys, (key, _n(attempt), self.jitter(), detail, ledger_flags_json())
        )
        return Step.from_fields(f)

    def note_waiting(self, key: str, attempt: int, note: str) -> bool:
        """Say on attempt `attempt` why it still waits for a worker (a worker without the tool
        handed it back). True while that attempt is the call's current one and waits in the
        queue; False: it was claimed, it ended, or it is of an older ledger life (its message
        is stale)."""
        k = self.keys.of(key)
        f = self._run("note", (k.call(key), k.epoch, k.clock), (attempt, note))
        return f["kind"] == "noted"

    def withdraw(self, key: str, attempt: int, *, fence: str) -> bool:
        """Remove the call's entry whose attempt `attempt` this worker (`fence`) claimed and
        will not run: the call waits for a person again (S13.3). True if it was removed."""
        k = self.keys.of(key)
        f = self._run(
            "withdraw",
            (k.call(key), k.queue_index, k.lease_index, k.close_index),
            (key, attempt, fence),
        )
        return f["kind"] == "withdrawn"

    # --- fenced attempts still running (the repeat guard, S5.4) ----------------------------------

    def hold_running(self, fenced: Sequence[tuple[str, float]]) -> None:
        """Renew the running lease of fenced attempts whose tool this process still runs:
        `(key, heartbeat_timeout)` pairs. Only an existing lease is renewed (`XX`)."""
        if not fenced:
            return
        pipe = self.client.pipeline(transaction=False)
        for key, timeout in fenced:
            pipe.set(self.keys.running(key), "1", px=max(1, int(timeout * 1000)), xx=True)
        pipe.execute()

    def release_running(self, key: str) -> None:
        """The fenced attempt's tool returned: it no longer runs."""
        self.client.delete(self.keys.running(key))

    def still_running(self, key: str) -> bool:
        """Whether a fenced attempt of `key` may still be running: its lease has not lapsed."""
        try:
            return bool(self.client.exists(self.keys.running(key)))
        except redis.RedisError as e:
            raise LedgerError(f"could not read the running lease of {key}: {e}") from e

    def recorded(self, key: str, *, status: str, error: str) -> bool:
        return self.recorded_many([(key, status, error)])[0]

    def recorded_many(self, outcomes: Sequence[tuple[str, str, str]]) -> list[bool]:
        """`recorded` for a batch of `(key, status, error)` written in one SQL transaction."""
        hot = self.hot
        if hot is not None:  # the recorder's hot path: packed, on a held connection
            replies = hot.run_many(
                hot.recorded,
                [
                    (key, (key, self.finished_ttl, self.events_maxlen, status, error))
                    for key, status, error in outcomes
                ],
            )
        else:
            replies = self._run_many(
                "recorded",
                [
                    (
                        (k.call(key), k.unrecorded_index, k.events, k.epoch, k.clock),
                        (key, self.finished_ttl, self.events_maxlen, status, error),
                    )
                    for key, status, error in outcomes
                    for k in (self.keys.of(key),)
                ],
            )
        return [reply["kind"] == "announced" for reply in replies]

    # --- write budgets (S13.1) ------------------------------------------------------------------

    def settle_budgets(self, key: str, scopes: Sequence[str], *, went_through: bool) -> int:
        """Reconciliation settled call `key`: its held charges in `scopes` are spent (it went
        through) or released (it did not run). Returns how many moved."""
        if not scopes:
            return 0
        s = self.keys.shard(0)
        verdict = "went_through" if went_through else "did_not_run"
        f = self._run("budget_settle", (s.epoch, s.clock, *scopes), (key, verdict))
        return int(f["moved"])

    def seed_budget(
        self,
        scope: str,
        *,
        epoch: str,
        window: float,
        charges: Sequence[tuple[str, str, int, float]],
    ) -> str:
        """Rebuild scope `scope` from SQL's `(key, state r|s|h, amount, spent_at)` charges, in
        ledger life `epoch` (compare-and-set: `budget_seed.lua`). Returns seeded, current or
        epoch."""
        s = self.keys.shard(0)
        args: list[object] = [shard_epoch(epoch, 0, self.keys.shards), window]
        for charge in charges:
            args.extend(charge)
        return self._run("budget_seed", (scope, s.epoch), args)["kind"]

    def read_budget(self, scope: str, *, window: float) -> tuple[float, float, float] | None:
        """A scope's (reserved, spent within the window, held) in this ledger life; None when it
        holds none (another life's, or gone: SQL has the count)."""
        s = self.keys.shard(0)
        f = self._run("budget_read", (scope, s.epoch, s.clock), (window,))
        if f["kind"] != "totals":
            return None
        return float(f["reserved"]), float(f["spent"]), float(f["held"])

    # --- reads ----------------------------------------------------------------------------------

    def due(self, index: str, *, now: float | None = None, limit: int = 500) -> list[str]:
        """Keys whose deadline in `index` has passed, oldest first, at most `limit`."""
        at = self.now() if now is None else now
        return [str(m) for m in self.client.zrangebyscore(index, "-inf", at, start=0, num=limit)]

    def read(self, key: str) -> LedgerCall | None:
        h = cast(dict[str, str], self.client.hgetall(self.keys.call(key)))
        return LedgerCall.from_hash(key, h) if h else None

    def read_many(self, keys: Sequence[str]) -> dict[str, LedgerCall | None]:
        """`read` of each key, in one round trip (a listing's calls in flight)."""
        if not keys:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(self.keys.call(key))
        hashes = cast(list[dict[str, str]], pipe.execute())
        return {
            key: LedgerCall.from_hash(key, h) if h else None
            for key, h in zip(keys, hashes, strict=True)
        }

    def position_and_read(
        self, keys: Sequence[str]
    ) -> tuple[str, dict[str, LedgerCall | None], set[str]]:
        """The events' newest position (`AgentEvents.latest_position`), then `read_many(keys)`,
        then which of `keys` are in the unrecorded index (decided, not yet in SQL: their
        `tool_call_finished` comes after the position). One round trip on one Redis, whose
        pipeline runs them in that order, so no event of these calls can come between the
        position and the reads (a caller's `wait`). On a cluster or a sharded ledger, the
        position and the reads in two steps in the same order, and no call counted unrecorded
        (the caller then reads SQL, as it would without knowing)."""
        events = self.events
        if len(events.streams) != 1 or isinstance(self.client, RedisCluster) or not keys:
            return events.latest_position(), self.read_many(keys), set()
        pipe = self.client.pipeline(transaction=False)
        pipe.xrevrange(events.streams[0], "+", "-", count=1)
        for key in keys:
            pipe.hgetall(self.keys.call(key))
        for key in keys:
            pipe.zscore(self.keys.of(key).unrecorded_index, key)
        newest, *replies = pipe.execute()
        hashes = cast(list[dict[str, str]], replies[: len(keys)])
        scores = replies[len(keys) :]
        entries = {
            key: LedgerCall.from_hash(key, h) if h else None
            for key, h in zip(keys, hashes, strict=True)
        }
        unrecorded = {key for key, score in zip(keys, scores, strict=True) if score is not None}
        return newest_position(newest), entries, unrecorded

    def live(self, keys: Sequence[str]) -> dict[str, bool]:
        """Whether the ledger still acts on each call: an entry of its current life, or an
        outcome decided in an older life (it happened; the unrecorded sweep writes it)."""
        shards = self.keys.all_shards
        pipe = self.client.pipeline(transaction=False)
        for shard in shards:
            pipe.get(shard.epoch)
        for key in keys:
            pipe.hmget(self.keys.call(key), "status", "epoch")
        replies = pipe.execute()
        epochs, entries = replies[: len(shards)], replies[len(shards) :]
        return {
            key: status is not None
            and (mine is None or mine == epochs[self.keys.shard_of(key)] or status != "active")
            for key, (status, mine) in zip(keys, entries, strict=True)
        }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
