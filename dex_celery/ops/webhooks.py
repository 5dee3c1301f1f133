"""Webhooks: tell people when a call waits for them, ended `outcome_unknown`, or was reconciled.

Sent by the beat side (a thread started from Celery's `beat_init`, `dex_celery.processes.beat`), never
by a worker: a tool call never waits for a receiver. The sender follows the AgentEvents stream
(S7.3) from a position it stores in Redis, and for each event of interest queues one delivery
per receiver (`Settings.webhook_urls`):

| webhook `event`               | from the stream                                        |
|-------------------------------|--------------------------------------------------------|
| `tool_call_awaiting_approval` | `tool_call_awaiting_approval` (once its preview is kept)  |
| `outcome_unknown`             | `tool_call_finished` with status `outcome_unknown`     |
| `reconciliation_report`       | `tool_call_outcome_reported` (the session was told)    |

Queueing is one Redis transaction: the deliveries (`HSETNX` on `webhooks:pending`, `ZADD NX` on
`webhooks:due`) and the new stream position together, so an event is queued once, however often
the sender restarts. Each delivery is a POST of a JSON body with headers `X-Dex-Event`,
`X-Dex-Delivery` (its id, the same on every retry: receivers deduplicate on it) and
`X-Dex-Signature: sha256=<hex HMAC-SHA256 of the body with Settings.webhook_secret>`. A try that
fails (connection refused, timeout, a status other than 2xx) is retried after
`webhook_backoff * 2**(tries-1)` seconds (capped at 5 minutes) until `webhook_max_attempts`
tries, then given up. POSTs run in a small thread pool, so a receiver that hangs delays only
its own deliveries. Delivery is at least once: a sender killed between a receiver's 2xx and the
delete of the delivery sends it again on restart.

Counts per receiver (delivered, retries, given up, last success, last error) live in the
`webhooks:stats` hash: `dex-celery webhooks status`, `delivery_status()` and the metrics read it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from dex_celery.engine import preview_pending, shown_preview
from dex_celery.errors import ConfigurationError, DexError
from dex_celery.ledger.events import AgentEvent, EventType
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord
from dex_celery.model.times import format_utc
from dex_celery.ops.present import conversation_before, cut_text
from dex_celery.store.unknowns import UnknownOutcomes
from dex_celery.tools.redact import record_arguments

if TYPE_CHECKING:
    from dex_celery.engine import RuntimeSource

log = logging.getLogger("dex_celery.ops.webhooks")

SIGNATURE_HEADER = "X-Dex-Signature"
EVENT_HEADER = "X-Dex-Event"
DELIVERY_HEADER = "X-Dex-Delivery"
#: Longest wait between two tries of one delivery.
MAX_BACKOFF = 300.0
#: Most deliveries started per loop turn; most POSTs in flight at once.
BATCH = 50
SENDERS = 8


class WebhookEvent(StrEnum):
    """The `event` field of a webhook body and its `X-Dex-Event` header."""

    AWAITING_APPROVAL = "tool_call_awaiting_approval"
    OUTCOME_UNKNOWN = "outcome_unknown"
    RECONCILIATION_REPORT = "reconciliation_report"


def webhook_event(event: AgentEvent) -> WebhookEvent | None:
    """Which webhook an events-stream entry causes, if any."""
    if event.type == EventType.TOOL_CALL_AWAITING_APPROVAL:
        return WebhookEvent.AWAITING_APPROVAL
    if event.type == EventType.TOOL_CALL_FINISHED and event.status is CallStatus.OUTCOME_UNKNOWN:
        return WebhookEvent.OUTCOME_UNKNOWN
    if event.type == EventType.TOOL_CALL_OUTCOME_REPORTED:
        return WebhookEvent.RECONCILIATION_REPORT
    return None


def receivers(urls: str | None) -> tuple[str, ...]:
    """The receivers of `Settings.webhook_urls`; anything but http(s) URLs is refused."""
    out = []
    for url in (u.strip() for u in (urls or "").split(",")):
        if not url:
            continue
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigurationError(f"webhook URL {receiver_label(url)!r} is not an http(s) URL")
        out.append(url)
    return tuple(out)


def receiver_label(url: str) -> str:
    """A receiver as status and metrics show it: no credentials, no query (tokens live there)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def sign(secret: str | None, body: bytes) -> str:
    """`sha256=<hex>` HMAC of the body; receivers compare with `hmac.compare_digest`."""
    digest = hmac.new((secret or "").encode(), body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def _url_id(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class Delivery:
    """One webhook to one receiver; kept in Redis (`webhooks:pending`) until done."""

    id: str
    url: str
    event: str
    body: str
    tries: int = 0
    last_error: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Delivery:
        return cls(**json.loads(text))


@dataclass(frozen=True, slots=True)
class ReceiverStatus:
    receiver: str
    delivered: int = 0
    retries: int = 0
    given_up: int = 0
    pending: int = 0
    last_ok_at: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None


@dataclass(frozen=True, slots=True)
class WebhookStatus:
    """What `dex-celery webhooks status` (and `dex-celery status`) shows."""

    configured: tuple[str, ...]
    pending: int
    position: str | None
    receivers: tuple[ReceiverStatus, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return {
            "configured": list(self.configured),
            "pending": self.pending,
            "position": self.position,
            "receivers": [asdict(r) for r in self.receivers],
        }


def delivery_status(source: RuntimeSource) -> WebhookStatus:
    """Delivery state from Redis: per receiver counts, what waits, where the sender is."""
    client: Any = source.runtime.redis
    keys = source.runtime.keys
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.webhook_stats)
    pipe.hvals(keys.webhook_pending)
    pipe.get(keys.webhook_cursor)
    raw_stats, pending_values, position = pipe.execute()
    configured = tuple(receiver_label(u) for u in receivers(source.runtime.settings.webhook_urls))
    by_receiver: dict[str, dict[str, Any]] = {r: {} for r in configured}
    for name, value in raw_stats.items():
        receiver, _, what = str(name).rpartition("|")
        by_receiver.setdefault(receiver, {})[what] = value
    waiting: dict[str, int] = {}
    for text in pending_values:
        try:
            label = receiver_label(Delivery.from_json(text).url)
        except (ValueError, TypeError):
            continue
        waiting[label] = waiting.get(label, 0) + 1
        by_receiver.setdefault(label, {})
    rows = []
    for receiver, values in sorted(by_receiver.items()):
        rows.append(
            ReceiverStatus(
                receiver=receiver,
                delivered=int(values.get("delivered", 0)),
                retries=int(values.get("retries", 0)),
                given_up=int(values.get("given_up", 0)),
                pending=waiting.get(receiver, 0),
                last_ok_at=_float(values.get("last_ok_at")),
                last_error=values.get("last_error"),
                last_error_at=_float(values.get("last_error_at")),
            )
        )
    return WebhookStatus(configured, len(pending_values), position, tuple(rows))


def _float(value: Any) -> float | None:
    return float(value) if value not in (None, "") else None


def render_status(status: WebhookStatus) -> str:
    """Plain lines for a terminal."""
    if not status.configured and not status.receivers:
        return "webhooks: none configured (DEX_WEBHOOK_URLS)"
    lines = [
        f"webhooks: {len(status.configured)} receiver(s), {status.pending} delivery(ies) waiting"
    ]
    for r in status.receivers:
        ok = format_utc(r.last_ok_at, millis=False)
        line = (
            f"  {r.receiver}: delivered {r.delivered}, waiting {r.pending}, "
            f"retries {r.retries}, given up {r.given_up}, last delivered {ok}"
        )
        if r.last_error:
            line += f", last error: {r.last_error}"
        lines.append(line)
    return "\n".join(lines)


class WebhookSender:
    """Follows the events stream, queues deliveries in Redis and POSTs them with retries."""

    def __init__(self, source: RuntimeSource, *, urls: Sequence[str] | None = None) -> None:
        self.source = source
        self.urls = (
            tuple(urls) if urls is not None else receivers(source.runtime.settings.webhook_urls)
        )
        self.events = source.runtime.events
        self._pool = ThreadPoolExecutor(max_workers=SENDERS, thread_name_prefix="dex-webhook")
        self._thread: threading.Thread | None = None
        self.stop_event = threading.Event()

    # --- queueing ------------------------------------------------------------------------------

    def queue_new_events(self, *, block: float | None = None) -> int:
        """Queue the deliveries of events after the stored position; returns how many."""
        client: Any = self.source.runtime.redis
        keys = self.source.runtime.keys
        position = client.get(keys.webhook_cursor)
        if position is None:
            # First start: from now on, not the whole history.
            position = self.events.latest_position()
            client.set(keys.webhook_cursor, position, nx=True)
            position = client.get(keys.webhook_cursor)
        read = self.events.read(str(position), count=BATCH, block=block)
        events = self._previews_settled(read)
        if not events:
            if read and block:  # an approval waits for its preview: look again shortly
                self.stop_event.wait(min(block, 0.2))
            return 0
        deliveries = [d for e in events for d in self._deliveries(e)]
        now = self.source.runtime.ledger.now()
        pipe = client.pipeline(transaction=True)
        for d in deliveries:
            pipe.hsetnx(keys.webhook_pending, d.id, d.to_json())
            pipe.zadd(keys.webhook_due, {d.id: now}, nx=True)
        pipe.set(keys.webhook_cursor, events[-1].position)
        pipe.execute()
        return len(deliveries)

    def _previews_settled(self, events: list[AgentEvent]) -> list[AgentEvent]:
        """The events up to the first approval whose preview may still come (S13.5): its
        webhook waits for the text, at most `2 x preview_timeout`, and so do those after it,
        which keeps the order of deliveries."""
        if not self.urls:
            return events
        runtime = self.source.runtime
        for i, event in enumerate(events):
            if webhook_event(event) is not WebhookEvent.AWAITING_APPROVAL or not event.key:
                continue
            record = runtime.store.get_call(event.key)
            if record is not None and preview_pending(
                record, runtime.tools, runtime.settings, runtime.ledger.now()
            ):
                return events[:i]
        return events

    def _deliveries(self, event: AgentEvent) -> list[Delivery]:
        kind = webhook_event(event)
        if kind is None or not self.urls:
            return []
        body = json.dumps(self._body(kind, event), sort_keys=True, ensure_ascii=False)
        return [
            Delivery(f"{event.position}:{_url_id(url)}", url, kind.value, body) for url in self.urls
        ]

    def _body(self, kind: WebhookEvent, event: AgentEvent) -> dict[str, Any]:
        body: dict[str, Any] = {
            "event": kind.value,
            "position": event.position,
            "occurred_at": event.timestamp,
            "key": event.key,
            "session_id": event.session_id,
            "turn_id": event.turn_id,
            "tool_call_id": event.tool_call_id,
        }
        record = self.source.runtime.store.get_call(event.key) if event.key else None
        if record is not None:
            body.update(
                tool=record.tool_name,
                effect_class=record.effect.value,
                status=record.status.value,
                arguments=record_arguments(record),
            )
            if kind is WebhookEvent.AWAITING_APPROVAL:
                body["approval_deadline"] = record.approval_deadline
                # What led to the call, for the person deciding (S12.1).
                body["conversation"] = self._conversation(record)
                # Held back by the repeat guard (S5.4): why, and the earlier call it repeats.
                body["repeat_of"] = record.repeat_of
                body["repeat_reason"] = record.repeat_reason
                # Waits because a write budget had too little left (S13.1): why.
                body["budget_reason"] = record.budget_reason
                # Approved once, but its tool changed before it ran: why it waits again (S13.3).
                body["waits_again"] = record.rewait_reason
                # What the call would do, from the tool's preview function (S13.5).
                runtime = self.source.runtime
                body["preview"] = shown_preview(
                    record, runtime.tools, runtime.settings, runtime.ledger.now()
                )
            if kind is WebhookEvent.OUTCOME_UNKNOWN:
                body["error"] = record.error
        if kind is WebhookEvent.RECONCILIATION_REPORT:
            row = UnknownOutcomes(self.source.runtime.store).get(event.key)
            body["report"] = row.report if row is not None else None
        return body

    def _conversation(self, record: ToolCallRecord) -> list[dict[str, Any]]:
        try:
            _calls, history = self.source.runtime.store.snapshot(record.session_id)
        except DexError:
            return []
        return [
            {**m, "text": cut_text(m["text"])[0]}
            for m in conversation_before(history, record.requested_at)
        ]

    # --- delivering ----------------------------------------------------------------------------

    def requeue_unfinished(self) -> int:
        """On start: deliveries a previous sender took but never finished are due again."""
        client: Any = self.source.runtime.redis
        keys = self.source.runtime.keys
        ids = client.hkeys(keys.webhook_pending)
        if not ids:
            return 0
        now = self.source.runtime.ledger.now()
        return int(client.zadd(keys.webhook_due, {i: now for i in ids}, nx=True))

    def deliver_due(self, *, wait: bool = False) -> int:
        """Start a POST for every delivery due now; returns how many were started."""
        client: Any = self.source.runtime.redis
        keys = self.source.runtime.keys
        ids = client.zrangebyscore(
            keys.webhook_due, "-inf", self.source.runtime.ledger.now(), 0, BATCH
        )
        futures = []
        for delivery_id in ids:
            if not client.zrem(keys.webhook_due, delivery_id):
                continue  # another sender took it
            text = client.hget(keys.webhook_pending, delivery_id)
            if text is None:
                continue
            futures.append(self._pool.submit(self._attempt, Delivery.from_json(text)))
        if wait:
            for f in futures:
                f.result()
        return len(futures)

    def _attempt(self, delivery: Delivery) -> None:
        try:
            error = self._post(delivery)
            self._settle(delivery, error)
        except Exception:  # Redis down mid-settle: the delivery stays pending, retried later
            log.exception("webhook delivery %s could not be settled", delivery.id)

    def _post(self, delivery: Delivery) -> str | None:
        """One try; None on a 2xx answer, else what went wrong."""
        body = delivery.body.encode()
        request = urllib.request.Request(
            delivery.url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": "dex-celery-webhooks",
                EVENT_HEADER: delivery.event,
                DELIVERY_HEADER: delivery.id,
                SIGNATURE_HEADER: sign(self.source.runtime.settings.webhook_secret, body),
            },
        )
        try:
            with urllib.request.urlopen(
                request, timeout=self.source.runtime.settings.webhook_timeout
            ) as r:
                status = int(r.status)
        except urllib.error.HTTPError as e:
            return f"HTTP {e.code}"
        except (OSError, ValueError) as e:  # refused, reset, timeout, bad URL
            reason = getattr(e, "reason", e)
            return f"{type(e).__name__}: {reason}"
        return None if 200 <= status < 300 else f"HTTP {status}"

    def _settle(self, delivery: Delivery, error: str | None) -> None:
        client: Any = self.source.runtime.redis
        keys = self.source.runtime.keys
        label = receiver_label(delivery.url)
        now = self.source.runtime.ledger.now()
        tries = delivery.tries + 1
        pipe = client.pipeline(transaction=True)
        if error is None:
            pipe.hdel(keys.webhook_pending, delivery.id)
            pipe.hincrby(keys.webhook_stats, f"{label}|delivered", 1)
            pipe.hset(keys.webhook_stats, f"{label}|last_ok_at", repr(now))
        else:
            pipe.hset(keys.webhook_stats, f"{label}|last_error", error)
            pipe.hset(keys.webhook_stats, f"{label}|last_error_at", repr(now))
            if tries >= self.source.runtime.settings.webhook_max_attempts:
                log.warning(
                    "webhook %s to %s given up after %d tries: %s", delivery.id, label, tries, error
                )
                pipe.hdel(keys.webhook_pending, delivery.id)
                pipe.hincrby(keys.webhook_stats, f"{label}|given_up", 1)
            else:
                delay = min(
                    MAX_BACKOFF, self.source.runtime.settings.webhook_backoff * 2 ** (tries - 1)
                )
                again = Delivery(
                    delivery.id, delivery.url, delivery.event, delivery.body, tries, error
                )
                pipe.hset(keys.webhook_pending, delivery.id, again.to_json())
                pipe.zadd(keys.webhook_due, {delivery.id: now + delay})
                pipe.hincrby(keys.webhook_stats, f"{label}|retries", 1)
        pipe.execute()

    # --- the loop ------------------------------------------------------------------------------

    def run(self, *, poll: float = 0.5) -> None:
        """Queue and deliver until `stop()`; errors (Redis away) are logged and retried."""
        self.requeue_unfinished()
        while not self.stop_event.is_set():
            try:
                self.queue_new_events(block=poll)
                self.deliver_due()
            except Exception:
                log.exception("webhook sender: trying again in %.1fs", poll)
                self.stop_event.wait(poll)

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self.run, name="dex-webhooks", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float = 5.0) -> None:
        self.stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
