"""The Redis attempt ledger: every state change of an attempt is one Lua script.

The ledger is where "this attempt reached a worker" is decided (S3.3), atomically and before any
tool code runs, and where each attempt's end decides the call's next step (retry or outcome).
Scripts are compare-and-set: two sweepers, a sweeper and a worker, or a late worker racing over
the same attempt cause exactly one transition.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from typing import Any, cast

import redis

from dex_celery.errors import LedgerError
from dex_celery.ledger.keys import KeySpace
from dex_celery.policy import PolicySnapshot

Clock = Callable[[], float]


class OpenResult(StrEnum):
    OPENED = "opened"
    EXISTS = "exists"
    EPOCH_CHANGED = "epoch"


class StepKind(StrEnum):
    """What the caller of a transition must do next."""

    RETRY = "retry"  # publish attempt `attempt` after `delay` seconds
    FINISHED = "finished"  # write the outcome to SQL, then call `recorded`
    LATE = "late"  # the attempt was fenced: keep the result as evidence only
    NOOP = "noop"  # someone else already moved this attempt


class Cause(StrEnum):
    """Why an attempt ended, as the scripts understand it (see `_common.lua`)."""

    OK = "ok"
    TOOL_ERROR = "tool_error"
    RETRYABLE = "retryable"
    TIMED_OUT = "timed_out"
    #: The tool's answer was lost after it may have acted (`ToolLost`); `next_step` treats it as
    #: a lost worker (retry, else failed for a read, else outcome_unknown).
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    attempt: int = 0
    delay: float = 0.0
    status: str = ""
    reason: str = ""
    log: str = ""
    detail: str = ""
    #: The worker's result arrived after the deadline and was kept as evidence only.
    late_result: bool = False

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> Step:
        kind = StepKind(reply[0])
        late = len(reply) > 1 and reply[-1] == "late_result"
        if kind is StepKind.RETRY:
            return cls(kind, attempt=int(reply[1]), delay=float(reply[2]), late_result=late)
        if kind is StepKind.FINISHED:
            return cls(
                kind,
                attempt=int(reply[3]),
                status=str(reply[1]),
                reason=str(reply[2]),
                log=str(reply[4]),
                detail=str(reply[5]),
                late_result=late,
            )
        return cls(kind)


@dataclass(frozen=True, slots=True)
class Claim:
    ok: bool
    reason: str = ""
    heartbeat_timeout: float = 0.0
    start_to_close: float = 0.0


@dataclass(frozen=True, slots=True)
class AttemptLogEntry:
    attempt: int
    state: str
    owner: str
    claimed_at: float | None
    ended_at: float


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
    refused: int
    log: tuple[AttemptLogEntry, ...]

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
            refused=int(h.get("refused", "0")),
            log=_parse_log(h.get("log", "")),
        )


def _parse_log(text: str) -> tuple[AttemptLogEntry, ...]:
    entries = []
    for item in filter(None, text.split(";")):
        n, state, owner, claimed, ended = item.split("|")
        entries.append(
            AttemptLogEntry(int(n), state, owner, float(claimed) if claimed else None, float(ended))
        )
    return tuple(entries)


def _load(name: str) -> str:
    source = resources.files("dex_celery.ledger").joinpath("scripts").joinpath(name).read_text()
    return source


_ENDING_SCRIPTS = ("finish", "lose", "expire", "time_out")


def _n(attempt: int | None) -> str:
    """Attempt number for a script; '' lets the sweeper act on whichever attempt is current."""
    return "" if attempt is None else str(attempt)


class Ledger:
    """Typed access to the ledger scripts. One instance per process; thread-safe."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        keys: KeySpace | None = None,
        events_maxlen: int = 100_000,
        finished_ttl: int = 3600,
        clock: Clock = time.time,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.client = client
        self.keys = keys or KeySpace()
        self.events_maxlen = events_maxlen
        self.finished_ttl = finished_ttl
        self.clock = clock
        self.jitter = jitter
        common = _load("_common.lua")
        self._scripts = {
            name: client.register_script(
                (common + "\n" if name in _ENDING_SCRIPTS else "") + _load(f"{name}.lua")
            )
            for name in ("open", "claim", "heartbeat", "recorded", *_ENDING_SCRIPTS)
        }

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return self._scripts[name](keys=list(keys), args=list(args))
        except redis.ResponseError as e:
            raise LedgerError(f"ledger script {name} failed: {e}") from e

    def _run_many(
        self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
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
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            replies = list(pipe.execute(raise_on_error=False))
            if not any(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
                break
            if not all(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
                raise LedgerError(f"ledger script {name} was missing for part of a batch")
            self.client.script_load(script.script)
        for reply in replies:
            if isinstance(reply, Exception):
                raise LedgerError(f"ledger script {name} failed: {reply}") from reply
        return replies

    def _ending_keys(self, key: str) -> tuple[str, ...]:
        k = self.keys
        return (k.call(key), k.queue_index, k.lease_index, k.close_index, k.unrecorded_index)

    # --- epoch --------------------------------------------------------------------------------

    def epoch(self, *, candidate: str) -> str:
        """This ledger's life id, creating it with `candidate` if Redis has none."""
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.keys.epoch, candidate, nx=True)
        pipe.get(self.keys.epoch)
        return str(pipe.execute()[1])

    # --- transitions ----------------------------------------------------------------------------

    def open(
        self,
        key: str,
        snapshot: PolicySnapshot,
        *,
        epoch: str,
        announce: bool = True,
        may_have_run: bool = False,
    ) -> OpenResult:
        """Create the call's entry with attempt 1 enqueued.

        `may_have_run`: a lost ledger may have handed this call to a worker already (a reopen
        after Redis lost its data); its attempts then count as having reached one (S4.2, S4.3).
        """
        return self.open_many(
            [(key, snapshot)], epoch=epoch, announce=announce, may_have_run=may_have_run
        )[0]

    def open_many(
        self,
        calls: Sequence[tuple[str, PolicySnapshot]],
        *,
        epoch: str,
        announce: bool = True,
        may_have_run: bool = False,
    ) -> list[OpenResult]:
        """`open` for the calls of one turn in one round trip (each open is still atomic)."""
        k = self.keys
        replies = self._run_many(
            "open",
            [
                (
                    (k.call(key), k.queue_index, k.epoch, k.events),
                    self._open_args(key, snapshot, epoch, announce, may_have_run),
                )
                for key, snapshot in calls
            ],
        )
        return [OpenResult(reply[0]) for reply in replies]

    def _open_args(
        self, key: str, snapshot: PolicySnapshot, epoch: str, announce: bool, may_have_run: bool
    ) -> tuple[Any, ...]:
        return (
            key,
            epoch,
            self.clock(),
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
        )

    def claim(self, key: str, attempt: int, *, owner: str, fence: str) -> Claim:
        k = self.keys
        reply = self._run(
            "claim",
            (k.call(key), k.queue_index, k.lease_index, k.close_index, k.events),
            (key, attempt, owner, fence, self.clock(), self.events_maxlen),
        )
        if int(reply[0]) == 1:
            return Claim(True, "", float(reply[1]), float(reply[2]))
        return Claim(False, str(reply[1]))

    def heartbeat(self, running: Sequence[tuple[str, str]]) -> set[str]:
        """Renew leases of `(key, fence)` pairs; return the keys that are fenced."""
        if not running:
            return set()
        args: list[object] = [self.clock()]
        for key, fence in running:
            args.extend((key, fence))
        reply = self._run(
            "heartbeat", (self.keys.lease_index, *(self.keys.call(k) for k, _ in running)), args
        )
        return {running[int(i) - 1][0] for i in reply}

    def finish(self, key: str, attempt: int, *, fence: str, cause: Cause, payload: str) -> Step:
        reply = self._run(
            "finish",
            (*self._ending_keys(key), self.keys.events),
            (
                key,
                attempt,
                fence,
                self.clock(),
                cause.value,
                payload,
                self.jitter(),
                self.events_maxlen,
            ),
        )
        return Step.from_reply(reply)

    def lose(self, key: str, attempt: int | None, *, worker_lost: bool, detail: str) -> Step:
        mode = "worker_lost" if worker_lost else "lapsed"
        reply = self._run(
            "lose",
            self._ending_keys(key),
            (key, _n(attempt), self.clock(), mode, self.jitter(), detail),
        )
        return Step.from_reply(reply)

    def expire(self, key: str, attempt: int | None, *, unpublished: bool, detail: str) -> Step:
        mode = "unpublished" if unpublished else "due"
        reply = self._run(
            "expire",
            self._ending_keys(key),
            (key, _n(attempt), self.clock(), mode, self.jitter(), detail),
        )
        return Step.from_reply(reply)

    def time_out(self, key: str, attempt: int | None, *, detail: str) -> Step:
        reply = self._run(
            "time_out",
            self._ending_keys(key),
            (key, _n(attempt), self.clock(), self.jitter(), detail),
        )
        return Step.from_reply(reply)

    def announce_finished(self, key: str, *, status: str, error: str) -> None:
        """The finished event of a call that ended without a ledger entry (approvals, lost data)."""
        self.announce({"type": "tool_call_finished", "key": key, "status": status, "error": error})

    def announce(self, fields: dict[str, str]) -> None:
        """Append one event to the AgentEvents stream (events outside the transition scripts)."""
        self.client.xadd(
            self.keys.events, cast(Any, dict(fields)), maxlen=self.events_maxlen, approximate=True
        )

    def recorded(self, key: str, *, status: str, error: str) -> bool:
        return self.recorded_many([(key, status, error)])[0]

    def recorded_many(self, outcomes: Sequence[tuple[str, str, str]]) -> list[bool]:
        """`recorded` for a batch of `(key, status, error)` written in one SQL transaction."""
        k = self.keys
        replies = self._run_many(
            "recorded",
            [
                (
                    (k.call(key), k.unrecorded_index, k.events),
                    (key, self.finished_ttl, self.events_maxlen, status, error),
                )
                for key, status, error in outcomes
            ],
        )
        return [int(reply) == 1 for reply in replies]

    # --- reads ----------------------------------------------------------------------------------

    def due(self, index: str, *, now: float | None = None, limit: int = 500) -> list[str]:
        """Keys whose deadline in `index` has passed, oldest first, at most `limit`."""
        at = self.clock() if now is None else now
        return [str(m) for m in self.client.zrangebyscore(index, "-inf", at, start=0, num=limit)]

    def current_attempts(self, keys: Iterable[str]) -> dict[str, int]:
        """The current attempt number of each call that still has a ledger entry."""
        keys = list(keys)
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hget(self.keys.call(key), "n")
        return {key: int(n) for key, n in zip(keys, pipe.execute(), strict=True) if n is not None}

    def read(self, key: str) -> LedgerCall | None:
        h = cast(dict[str, str], self.client.hgetall(self.keys.call(key)))
        return LedgerCall.from_hash(key, h) if h else None

    def exists(self, keys: Sequence[str]) -> dict[str, bool]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.exists(self.keys.call(key))
        return {key: bool(v) for key, v in zip(keys, pipe.execute(), strict=True)}
