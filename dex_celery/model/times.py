"""Times as people read and type them (the CLI, the web app, errors, webhooks): always UTC, with the zone written out.

Stored times are Unix seconds; a person reads `2026-11-30 22:40:55.123 UTC` and types
`--since 2026-11-30T22:00`, `--since 2026-11-30T22:00+01:00` or `--since 15m` (also s, h, d).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

from dex_celery.errors import InvalidRequest

_RELATIVE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def format_utc(value: float | None, *, millis: bool = True) -> str:
    """`2026-11-30 22:40:55.123 UTC`; `-` for no time."""
    if not value:
        return "-"
    text = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(value))
    if millis:
        text += f".{int(value * 1000) % 1000:03d}"
    return text + " UTC"


#: A plain number of seconds (no exponent, no `inf`/`nan`: a duration is written as people do).
_SECONDS = re.compile(r"[+-]?\d+(?:\.\d+)?")
#: How a duration may be written, for error messages.
DURATION_FORMS = "a number of seconds, or a number and a unit: 30s, 5m, 2h, 30d"


def parse_seconds(text: str, *, option: str = "duration") -> float:
    """The one duration syntax of every duration-valued setting: `90` or `90.5` (seconds),
    `30s`, `5m`, `2h`, `30d`. The setting checks the range (positive, or 0 allowed)."""
    value = text.strip()
    relative = _RELATIVE.fullmatch(value)
    if relative is not None:
        return float(relative.group(1)) * _UNIT[relative.group(2)]
    if _SECONDS.fullmatch(value):
        return float(value)
    raise InvalidRequest(f"{option} {text!r} is not a duration ({DURATION_FORMS})")


def parse_duration(text: str, *, option: str = "duration") -> float:
    """`30s`, `15m`, `2h`, `30d` as seconds, the unit required (the retention setting,
    `history prune --before`: a bare `30` would mean 30 seconds, and remove nearly all)."""
    relative = _RELATIVE.fullmatch(text.strip())
    if relative is None or float(relative.group(1)) <= 0:
        raise InvalidRequest(
            f"{option} {text!r} is not a positive duration (a number and a unit: 30s, 15m, 2h, 30d)"
        )
    return parse_seconds(text, option=option)


def parse_since(text: str, *, now: float | None = None, option: str = "--since") -> float:
    """`15m`, `2h`, `1d` ago, or an ISO 8601 date/time (UTC unless it names a zone)."""
    value = text.strip()
    relative = _RELATIVE.fullmatch(value)
    if relative:
        now = time.time() if now is None else now
        return now - float(relative.group(1)) * _UNIT[relative.group(2)]
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(
            f"{option} {text!r} is neither a duration (30s, 15m, 2h, 1d) nor an ISO 8601 time "
            "(2026-11-30 or 2026-11-30T22:00, UTC unless a zone is given)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
