"""The Celery app that test workers run: tools that keep their own side-effect log.

Each tool appends one line per execution to `$DEX_TEST_TOOL_LOG/<key>.log` (key with `/`
replaced), written by the tool itself, so crash tests can count real executions independently of
the ledger and SQL. Tools that must be killed mid-run wait for a release file or a deadline.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from celery import Celery, signals

from dex_celery import (
    Dex,
    EffectClass,
    RetryableToolError,
    Settings,
    ToolContext,
    ToolError,
    ToolPolicy,
)
from dex_celery.engine.attempt.pause_points import (
    PAUSE_AT_ENV,
    PAUSE_DIR_ENV,
    PAUSE_TIMEOUT_ENV,
    PausePoint,
    armed,
    hold,
)
from dex_celery.errors import AttemptCancelled, ToolLost

LOG_ENV = "DEX_TEST_TOOL_LOG"
#: Set to `1` in a worker's environment: every tool task blocks in `task_prerun`, before its claim,
#: until `<log>/release-prerun` exists (crash tests of "delivered, not claimed", S4.2).
BLOCK_BEFORE_CLAIM_ENV = "DEX_TEST_BLOCK_BEFORE_CLAIM"
#: Seconds: a short Kombu `visibility_timeout`, with the restore sweep every second, so a test can
#: make the broker redeliver the unacknowledged messages of a killed worker quickly.
VISIBILITY_TIMEOUT_ENV = "DEX_TEST_VISIBILITY_TIMEOUT"
#: The queue of `unserved_write`; test workers consume only Celery's default queue.
UNSERVED_QUEUE = "dex-test-unserved"


def log_dir() -> Path:
    path = Path(os.environ.get(LOG_ENV, "/tmp/dex-test-tool-log"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def log_file(key: str) -> Path:
    return log_dir() / (key.replace("/", "__") + ".log")


def executions(key: str) -> list[str]:
    """Lines the tool itself wrote for `key`: `start <attempt> <pid>` / `end <attempt> <pid>`."""
    path = log_file(key)
    return path.read_text().splitlines() if path.exists() else []


def charges(order: str) -> list[str]:
    """The `charge` tool's side-effect log of one order: one line per charge it made."""
    path = log_dir() / f"charges-{order}.log"
    return path.read_text().splitlines() if path.exists() else []


def _note(ctx: ToolContext, what: str) -> None:
    with log_file(ctx.idempotency_key).open("a") as f:
        f.write(f"{what} {ctx.attempt} {os.getpid()} {ctx.idempotency_key}\n")
        f.flush()
        os.fsync(f.fileno())


def _hold(ctx: ToolContext, seconds: float) -> None:
    """Run for `seconds`, or until the test drops `<log>/release`; the kill lands in here."""
    deadline = time.monotonic() + seconds
    release = log_dir() / "release"
    while time.monotonic() < deadline and not release.exists():
        time.sleep(0.05)


#: The tool of a "newer release" (version skew): a write the previous release's worker app
#: (`tests/support/apps/skew_apps.py`) does not have.
NEW_TOOL = "audit"
#: Its policy as this app (the requesters' release) registers it: a start-to-close long
#: enough for its run; a worker app may register it otherwise, and must still run a call under
#: the call's recorded snapshot (S1.5).
NEW_TOOL_POLICY = ToolPolicy(
    effect=EffectClass.NON_IDEMPOTENT_WRITE,
    requires_approval=False,
    repeat_guard=False,
    start_to_close=20.0,
)


def make_app(
    settings: Settings | None = None,
    *,
    without: frozenset[str] = frozenset(),
    new_tool_policy: ToolPolicy = NEW_TOOL_POLICY,
) -> tuple[Celery, Dex]:
    """The test tools; `without`: names left out (an older release's worker app);
    `new_tool_policy`: how this app registers `NEW_TOOL`."""
    settings = settings or Settings.from_env()
    app = Celery("dex_test_tools")
    dex = Dex(app, settings)
    # What a deployment's beat sends (the reconcile job); the sweeper runs inside beat itself.
    app.conf.beat_schedule = dex.beat_schedule()
    visibility = os.environ.get(VISIBILITY_TIMEOUT_ENV)
    if visibility:
        app.conf.broker_transport_options = {
            **(app.conf.broker_transport_options or {}),
            "visibility_timeout": float(visibility),
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        }

    def slow(ctx: ToolContext, seconds: float = 30.0, value: Any = "done") -> Any:
        _note(ctx, "start")
        _hold(ctx, seconds)
        _note(ctx, "end")
        return value

    # The generic tools of the crash tests opt out of the repeat guard (S5.4): those tests ask
    # for many identical calls at once to test other guarantees; the guard's own tests use
    # `charge_order` and the `guarded_*` tools, which keep it on.
    for effect in EffectClass:
        dex.tool(
            f"slow_{effect.value}",
            policy=ToolPolicy(effect=effect, requires_approval=False, repeat_guard=False),
        )(slow)

    # A lease much shorter than the deployment's heartbeat timeout: only the worker's heartbeat
    # thread keeps these alive (they never heartbeat themselves).
    for effect in (EffectClass.READ, EffectClass.NON_IDEMPOTENT_WRITE):
        dex.tool(
            f"short_lease_{effect.value}",
            policy=ToolPolicy(
                effect=effect, requires_approval=False, heartbeat_timeout=2.0, repeat_guard=False
            ),
        )(slow)

    @dex.tool(policy=ToolPolicy(effect=EffectClass.READ))
    def echo(ctx: ToolContext, **arguments: Any) -> Any:
        _note(ctx, "start")
        return {"key": ctx.idempotency_key, "attempt": ctx.attempt, "arguments": arguments}

    @dex.tool(policy=ToolPolicy(effect=EffectClass.IDEMPOTENT_WRITE))
    def failing(ctx: ToolContext, message: str = "the order does not exist") -> Any:
        _note(ctx, "start")
        raise ToolError(message)

    @dex.tool(policy=ToolPolicy(effect=EffectClass.READ, max_attempts=3, backoff_initial=0.1))
    def flaky_read(ctx: ToolContext, fail_times: int = 1) -> Any:
        _note(ctx, "start")
        if ctx.attempt <= fail_times:
            raise RetryableToolError(f"transient failure on attempt {ctx.attempt}")
        return {"attempt": ctx.attempt}

    @dex.tool(
        policy=ToolPolicy(
            effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False, start_to_close=1.5
        )
    )
    def overtime(ctx: ToolContext, seconds: float = 4.0) -> Any:
        """Ignores its soft time limit, as tool code that cannot be stopped would (S5.1)."""
        _note(ctx, "start")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                time.sleep(0.05)
            except Exception:  # SoftTimeLimitExceeded: keep going, like uncooperative code
                continue
        _note(ctx, "end")
        return "late value"

    @dex.tool(policy=ToolPolicy(effect=EffectClass.READ, heartbeat_timeout=2.0))
    def cooperative(ctx: ToolContext, seconds: float = 30.0) -> Any:
        _note(ctx, "start")
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                ctx.heartbeat(raise_if_cancelled=True)
                time.sleep(0.1)
        except AttemptCancelled:
            _note(ctx, "cancelled")
            raise
        return "finished"

    # Approvals (S1.3, S6): writes that wait for a person before they run.
    @dex.tool(policy=ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, repeat_guard=False))
    def guarded_write(ctx: ToolContext, value: Any = "done") -> Any:
        """A non-idempotent write without an approval override: asks a person (S1.3)."""
        _note(ctx, "start")
        return value

    @dex.tool(
        policy=ToolPolicy(
            effect=EffectClass.NON_IDEMPOTENT_WRITE, approval_timeout=1.0, repeat_guard=False
        )
    )
    def guarded_write_short(ctx: ToolContext, value: Any = "done") -> Any:
        """Like `guarded_write`, but its approval deadline passes one second after the request."""
        _note(ctx, "start")
        return value

    # Secrets (S9.2): `api_token` never reaches Flower, logs or `calls show`.
    @dex.tool(policy=ToolPolicy(effect=EffectClass.READ, secret_arguments=("api_token",)))
    def with_secret(ctx: ToolContext, query: str = "", api_token: str = "") -> Any:
        """A read that authenticates with a token passed as an argument."""
        _note(ctx, "start")
        return {"query": query, "token_length": len(api_token)}

    _async_tools(dex)
    _edge_tools(dex)
    _preview_tools(dex)

    # Clock skew (S10.1, tests/crash/clock/test_clock_skew.py): tools whose outcome would change if
    # any decision used a host's clock instead of Redis's.
    @dex.tool(policy=ToolPolicy(effect=EffectClass.READ))
    def host_clock(ctx: ToolContext) -> Any:
        """The worker host's wall clock, so a test can see that its clock shim is in force."""
        _note(ctx, "start")
        return {"time": time.time(), "datetime": datetime.now(UTC).timestamp()}

    @dex.tool(
        policy=ToolPolicy(
            effect=EffectClass.READ, max_attempts=3, backoff_initial=1.0, backoff_max=1.0
        )
    )
    def flaky_read_backoff(ctx: ToolContext, fail_times: int = 1) -> Any:
        """Like `flaky_read`, with a backoff long enough to be waited out on some clock."""
        _note(ctx, "start")
        if ctx.attempt <= fail_times:
            raise RetryableToolError(f"transient failure on attempt {ctx.attempt}")
        return {"attempt": ctx.attempt}

    @dex.tool(policy=ToolPolicy(effect=EffectClass.READ, repeat_guard=False))
    def until(ctx: ToolContext, at: float) -> Any:
        """Returns at wall-clock time `at` (the host's clock): calls given the same `at` end
        together, e.g. hundreds of greenlets acknowledging at once."""
        time.sleep(max(0.0, at - time.time()))
        return "done"

    @dex.tool(policy=ToolPolicy(effect=EffectClass.READ, heartbeat_timeout=2.0))
    def slow_short_heartbeat(ctx: ToolContext, seconds: float = 4.0) -> Any:
        """Runs past its own heartbeat timeout, never beating itself: the worker's pump keeps
        its lease alive."""
        _note(ctx, "start")
        _hold(ctx, seconds)
        _note(ctx, "end")
        return "done"

    @dex.tool(
        policy=ToolPolicy(
            effect=EffectClass.NON_IDEMPOTENT_WRITE,
            requires_approval=False,
            schedule_to_start=2.0,
            repeat_guard=False,
        )
    )
    def unserved_write(ctx: ToolContext) -> Any:
        """Routed to a queue no test worker consumes: it expires waiting for a worker."""
        _note(ctx, "start")
        return "ran"

    app.conf.task_routes = {"dex.tool.unserved_write": {"queue": UNSERVED_QUEUE}}
    if NEW_TOOL not in without:
        dex.tool(NEW_TOOL, policy=new_tool_policy)(slow)
    return app, dex


def previews_run(order: str) -> list[str]:
    """The preview functions' own log of one order: `start <pid>` / `end <pid>` per run."""
    path = log_dir() / f"preview-{order}.log"
    return path.read_text().splitlines() if path.exists() else []


def _preview_note(order: str, what: str) -> None:
    with (log_dir() / f"preview-{order}.log").open("a") as f:
        f.write(f"{what} {os.getpid()}\n")
        f.flush()
        os.fsync(f.fileno())


def _preview_tools(dex: Dex) -> None:
    """Writes that wait for approval with a preview (docs/guardrails.md, "Previews"): one that
    says what the refund would do (naming the secret card, which every output must hide), one
    whose preview raises, one whose preview hangs past `preview_timeout`."""

    def refund_preview(order: str, amount: Decimal, card: str, hold: float = 0.0) -> str:
        _preview_note(order, "start")
        time.sleep(hold)
        _preview_note(order, "end")
        return f"Refund {amount:.2f} EUR to Ada Lovelace for order {order} (card {card})"

    @dex.tool(
        policy=ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, secret_arguments=("card",)),
        preview=refund_preview,
    )
    def previewed_refund(
        ctx: ToolContext, order: str, amount: Decimal, card: str, hold: float = 0.0
    ) -> Any:
        """Refunds `amount` of `order` to `card`; waits for approval."""
        _note(ctx, "start")
        return {"refunded": order, "amount": str(amount)}

    def failing_preview(order: str) -> str:
        _preview_note(order, "start")
        raise LookupError(f"order {order} is not in the shop's database")

    @dex.tool(policy=ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE), preview=failing_preview)
    def preview_raises(ctx: ToolContext, order: str) -> Any:
        _note(ctx, "start")
        return {"done": order}

    def hanging_preview(order: str) -> str:
        _preview_note(order, "start")
        time.sleep(60)
        return "never shown"

    @dex.tool(policy=ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE), preview=hanging_preview)
    def preview_hangs(ctx: ToolContext, order: str) -> Any:
        _note(ctx, "start")
        return {"done": order}


async def _ahold(ctx: ToolContext, seconds: float) -> None:
    """`_hold` for async tools: awaits (never blocks the loop) until released or `seconds`."""
    deadline = time.monotonic() + seconds
    release = log_dir() / "release"
    while time.monotonic() < deadline and not release.exists():
        await asyncio.sleep(0.05)


def _async_tools(dex: Dex) -> None:
    """`async def` tools: awaited on the worker process's event loop, whatever the pool."""

    @dex.tool(policy=ToolPolicy(effect=EffectClass.READ))
    async def async_echo(ctx: ToolContext, text: str, delay: float = 0.01) -> Any:
        _note(ctx, "start")
        await asyncio.sleep(delay)
        return {"text": text, "attempt": ctx.attempt}

    @dex.tool(policy=ToolPolicy(effect=EffectClass.IDEMPOTENT_WRITE))
    async def async_failing(ctx: ToolContext, message: str = "no such order") -> Any:
        _note(ctx, "start")
        await asyncio.sleep(0.01)
        raise ToolError(message)

    async def async_slow(ctx: ToolContext, seconds: float = 30.0) -> Any:
        _note(ctx, "start")
        try:
            await _ahold(ctx, seconds)
        except asyncio.CancelledError:
            _note(ctx, "cancelled")
            raise
        _note(ctx, "end")
        return "done"

    for effect in (EffectClass.READ, EffectClass.NON_IDEMPOTENT_WRITE):
        dex.tool(
            f"async_slow_{effect.value}",
            policy=ToolPolicy(effect=effect, requires_approval=False, repeat_guard=False),
        )(async_slow)

    @dex.tool(
        policy=ToolPolicy(
            effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False, start_to_close=1.5
        )
    )
    async def async_overtime(ctx: ToolContext, seconds: float = 20.0) -> Any:
        """Runs past its start-to-close: the fenced attempt's coroutine must be cancelled."""
        _note(ctx, "start")
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            _note(ctx, "cancelled")
            raise
        _note(ctx, "end")
        return "late"

    @dex.tool(policy=ToolPolicy(effect=EffectClass.READ, max_attempts=1))
    async def async_long_await(ctx: ToolContext, seconds: float = 4.0) -> Any:
        """One await longer than the heartbeat timeout, without a heartbeat of its own."""
        _note(ctx, "start")
        await asyncio.sleep(seconds)
        _note(ctx, "end")
        return {"slept": seconds}

    @dex.tool(
        policy=ToolPolicy(
            effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False, heartbeat_timeout=3.0
        )
    )
    def heartbeating_write(ctx: ToolContext, seconds: float = 4.0, hold: bool = False) -> Any:
        """A write that heartbeats as the README advises, and stops only when told to.

        `hold`: heartbeat for no time, then wait for the test's release file (`_hold`), so the
        test decides the moment the tool returns (and the worker reports its end)."""
        _note(ctx, "start")
        if hold:
            _hold(ctx, 30.0)
            _note(ctx, "end")
            return {"beats": 0}
        deadline = time.monotonic() + seconds
        beats = 0
        while time.monotonic() < deadline:
            if not ctx.heartbeat():
                _note(ctx, "fenced")
                raise ToolError("the attempt was fenced; stopped")
            beats += 1
            time.sleep(0.05)
        _note(ctx, "end")
        return {"beats": beats}

    @dex.tool(policy=ToolPolicy(effect=EffectClass.READ))
    def sync_returns_coroutine(ctx: ToolContext) -> Any:
        """A plain function handing back a coroutine: refused, never a silent coroutine."""
        return asyncio.sleep(0)


def _edge_tools(dex: Dex) -> None:
    """Tools for the edges of issue 11: typed arguments, secrets in errors, results."""

    @dex.tool(policy=ToolPolicy(effect=EffectClass.READ))
    def typed(ctx: ToolContext, order: int, amount: Decimal, note: dict[str, Any]) -> Any:
        """Reports the exact Python values it received."""
        _note(ctx, "start")
        return {"order": repr(order), "amount": repr(amount), "note": repr(note)}

    @dex.tool(
        policy=ToolPolicy(
            effect=EffectClass.NON_IDEMPOTENT_WRITE,
            requires_approval=False,
            secret_arguments=("api_token",),
        )
    )
    def leaky(ctx: ToolContext, order: int, api_token: str) -> Any:
        """Puts its secret into an exception's text, as `int(api_token)` does."""
        _note(ctx, "start")
        logging.getLogger("tests.leaky").info("charging order %s", order)
        return int(api_token)

    @dex.tool(
        policy=ToolPolicy(
            effect=EffectClass.NON_IDEMPOTENT_WRITE,
            requires_approval=False,
            secret_arguments=("credentials",),
        )
    )
    def leaky_nested(ctx: ToolContext, order: int, credentials: dict[str, Any]) -> Any:
        """Puts leaves of a secret dict (a string, a list item, a number) into its error text,
        and logs and prints them first."""
        _note(ctx, "start")
        logging.getLogger("tests.leaky").warning("charging order %s with %s", order, credentials)
        # Celery logs a pool process's stdout: the print reaches the worker's log too.
        print(f"about to log in with {credentials['password']}")
        raise ValueError(
            f"login refused for {credentials['user']} with password {credentials['password']}, "
            f"key {credentials['keys'][1]}, pin {credentials['pin']}"
        )

    @dex.tool(policy=ToolPolicy(effect=EffectClass.READ, secret_arguments=("credentials",)))
    def nested_secret(ctx: ToolContext, query: str, credentials: dict[str, Any]) -> Any:
        """Returns leaves of a secret dict: the result keeps its shape, not the values."""
        _note(ctx, "start")
        return {
            "query": query,
            "password_length": len(credentials["password"]),
            "echo": f"used {credentials['password']}",
            "keys": credentials["keys"],
            "pin": credentials["pin"],
        }

    @dex.tool(
        policy=ToolPolicy(
            effect=EffectClass.READ,
            max_attempts=3,
            backoff_initial=0.1,
            secret_arguments=("api_token",),
        )
    )
    def flaky_secret(ctx: ToolContext, api_token: str) -> Any:
        """Fails its first attempt: the retry must still get the real token (read back sealed)."""
        _note(ctx, "start")
        if ctx.attempt == 1:
            raise RetryableToolError(f"the service refused {api_token} for now")
        return {"attempt": ctx.attempt, "token_length": len(api_token)}

    @dex.tool(
        policy=ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, secret_arguments=("card",))
    )
    def guarded_secret(ctx: ToolContext, card: str) -> Any:
        """Waits for approval; runs with the real card number once approved."""
        _note(ctx, "start")
        return {"card_length": len(card), "echo": f"charged {card}"}

    @dex.tool(
        policy=ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, secret_arguments=("card",))
    )
    def guarded_profile(
        ctx: ToolContext, order: int, card: dict[str, Any], note: dict[str, Any]
    ) -> Any:
        """Waits for approval; a secret dict (`card`) and a key named `secret` inside `note`:
        every output shows both hidden the same way (dex_celery/tools/redact.py)."""
        _note(ctx, "start")
        return {"order": order}

    @dex.tool(
        policy=ToolPolicy(
            effect=EffectClass.NON_IDEMPOTENT_WRITE,
            requires_approval=False,
            start_to_close=2.0,
            approval_timeout=8.0,
        )
    )
    def charge_order(ctx: ToolContext, order: str, seconds: float = 0.0) -> Any:
        """Charges `order` (the repeat guard's reproduction, S5.4): one `charge` line per
        execution in the order's own side-effect log (`charges(order)`), whatever the call key;
        ignores its soft time limit, as tool code that cannot be stopped would."""
        _note(ctx, "start")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                time.sleep(0.05)
            except Exception:  # SoftTimeLimitExceeded: keep going, like uncooperative code
                continue
        with (log_dir() / f"charges-{order}.log").open("a") as f:
            f.write(f"charge {ctx.idempotency_key} {os.getpid()}\n")
            f.flush()
            os.fsync(f.fileno())
        _note(ctx, "end")
        return {"charged": order}

    @dex.tool(policy=ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False))
    def charge(
        ctx: ToolContext, order: str, amount: int, memo: str | None = None, seconds: float = 0.0
    ) -> Any:
        """Charges `amount` to `order` (the repeat guard's identity, S12.2): holds until the
        test drops `<log>/release-<order>` (so the call is still pending when its variations
        are asked), then writes one line per execution to the order's side-effect log
        (`charges(order)`) with the values it received."""
        _note(ctx, "start")
        release = log_dir() / f"release-{order}"
        deadline = time.monotonic() + 60
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(seconds)
        with (log_dir() / f"charges-{order}.log").open("a") as f:
            f.write(f"charge {ctx.idempotency_key} {amount!r} {memo!r} {seconds!r}\n")
            f.flush()
            os.fsync(f.fileno())
        _note(ctx, "end")
        return {"charged": order, "amount": amount}

    @dex.tool(policy=ToolPolicy(effect=EffectClass.READ))
    def big_read(ctx: ToolContext, size: int) -> Any:
        _note(ctx, "start")
        return "x" * size

    @dex.tool(policy=ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False))
    def big_write(ctx: ToolContext, size: int) -> Any:
        _note(ctx, "start")
        return "x" * size

    @dex.tool(
        policy=ToolPolicy(
            effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False, repeat_guard=False
        )
    )
    def lost_reply_write(ctx: ToolContext) -> Any:
        """Its effect takes place (the log line), then the service's answer is lost: the
        attempt ends `lost`, so the call is `outcome_unknown` (S4.3)."""
        _note(ctx, "start")
        raise ToolLost("the service took the request, then the connection dropped")

    @dex.tool(policy=ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False))
    def non_json_write(ctx: ToolContext) -> Any:
        """Its effect takes place (the log line), then it returns something JSON cannot hold."""
        _note(ctx, "start")
        return {1, 2, 3}


app, dex = make_app()


@signals.worker_ready.connect
def _announce_ready(sender: Any = None, **_: Any) -> None:
    (log_dir() / f"ready-{os.getpid()}").write_text(str(time.time()))


def prerun_marker(task_id: str) -> Path:
    """Written by a worker started with `DEX_TEST_BLOCK_BEFORE_CLAIM=1` once it holds `task_id`."""
    return log_dir() / ("prerun-" + task_id.replace("/", "__").replace("#", "-"))


@signals.task_prerun.connect
def _block_before_claim(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
    """Hold a delivered tool task before its claim (test hook; inactive unless the env says so)."""
    if os.environ.get(BLOCK_BEFORE_CLAIM_ENV) != "1" or task_id is None:
        return
    if not str(getattr(sender, "name", "")).startswith("dex.tool."):
        return
    hold(prerun_marker(task_id), log_dir() / "release-prerun", 120, str(os.getpid()))


#: `1`: the worker's outcome writer never writes (as if each process died right after its
#: finish script), so only the sweeper can record outcomes.
STALL_WRITER_ENV = "DEX_TEST_STALL_OUTCOME_WRITER"


def _stall_outcome_writer() -> None:
    """Test hook: inactive unless the env says so. The engine's `before_record` pause point
    (dex_celery/engine/attempt/pause_points.py), held for an hour: no writer ever writes. Armed when the
    worker imports this module, before anything forks, so every writer of the worker is
    stalled: the pool processes' own and the outcome recorder's (`OutcomeChannel`, prefork)."""
    if os.environ.get(STALL_WRITER_ENV) != "1":
        return
    named = {p for p in os.environ.get(PAUSE_AT_ENV, "").split(",") if p}
    os.environ[PAUSE_AT_ENV] = ",".join(sorted(named | {PausePoint.BEFORE_RECORD.value}))
    os.environ.setdefault(PAUSE_DIR_ENV, str(log_dir() / "pause"))
    os.environ[PAUSE_TIMEOUT_ENV] = "3600"
    armed.cache_clear()


_stall_outcome_writer()

#: A file path: the worker's outcome recorder (`OutcomeChannel`, prefork) writes its pid there
#: and takes outcomes from the pool processes but never writes them, so a test can SIGKILL it
#: while outcomes are pending in it. The pool processes' own writers are left alone.
STALL_RECORDER_ENV = "DEX_TEST_STALL_RECORDER"


def _stall_recorder() -> None:
    """Test hook: inactive unless the env says so; applied at import, before anything forks."""
    pid_file = os.environ.get(STALL_RECORDER_ENV)
    if not pid_file:
        return
    from dex_celery.engine.attempt.outcome_writer import OutcomeChannel, OutcomeWriter

    loop = OutcomeChannel._loop

    def stalled_loop(self: OutcomeChannel, writer: OutcomeWriter) -> None:
        writer._write = lambda batch: threading.Event().wait()  # type: ignore[method-assign]
        Path(pid_file).write_text(str(os.getpid()))
        loop(self, writer)

    OutcomeChannel._loop = stalled_loop  # type: ignore[method-assign]


_stall_recorder()
