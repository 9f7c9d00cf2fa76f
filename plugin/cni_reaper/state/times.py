"""Record times: ISO 8601 in UTC with microseconds, written and parsed by hand (importing `datetime` costs the
hot path milliseconds). The one parser of record times: a record's check (state/record_checks.py, generated),
every reader and the index use it, so a time the check lets through is a time every reader reads."""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_ZONES = ("", "Z", "+00:00", "-00:00")


def iso_now() -> str:
    return iso_at(time.time())


def iso_at(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when)) + f".{int(when % 1 * 1e6):06d}Z"


def parse_time(text: Any) -> float:
    """Seconds since the epoch of YYYY-MM-DDTHH:MM:SS[.f{1,6}] in UTC (Z, +00:00, -00:00 or no zone), as
    iso_now() and pydantic write it. The one parser of record times: the check of a record read back
    (`problem`) and every reader use it, so a time the check lets through is a time every reader reads.
    ValueError otherwise (checked by hand: `re` costs milliseconds to import)."""
    if not isinstance(text, str) or len(text) < 19 or not text.isascii():
        raise _not_a_time(text)
    y, mo, d, h, mi, sec = _clock(text)
    fraction = _fraction(text)
    if not (_a_day(y, mo, d) and h < 24 and mi < 60 and sec < 60):
        raise ValueError(f"not a date: {text!r}"[:120])
    return _days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec + fraction


def _a_day(y: int, mo: int, d: int) -> bool:
    """Whether year `y`, month `mo`, day `d` is a day of the proleptic Gregorian calendar."""
    leap = y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)
    return y > 0 and 1 <= mo <= 12 and 1 <= d <= (_DAYS[mo - 1] if mo != 2 or leap else 28)


def _not_a_time(text: Any) -> ValueError:
    return ValueError(f"not a record time: {text!r}"[:120])


def _clock(v: str) -> tuple[int, ...]:
    """Year, month, day, hour, minute, second of YYYY-MM-DDTHH:MM:SS (ValueError when it has not that shape)."""
    if v[4] != "-" or v[7] != "-" or v[10] != "T" or v[13] != ":" or v[16] != ":":
        raise _not_a_time(v)
    fields = (v[0:4], v[5:7], v[8:10], v[11:13], v[14:16], v[17:19])
    if not all(f.isdigit() for f in fields):
        raise _not_a_time(v)
    return tuple(int(f) for f in fields)


def _fraction(v: str) -> float:
    """The fraction of a second after the seconds (.f{1,6}, or none), the zone after it being UTC's."""
    tail, fraction = v[19:], 0.0
    if tail.startswith("."):
        n = 1
        while n < len(tail) and tail[n].isdigit():
            n += 1
        if not 2 <= n <= 7:
            raise _not_a_time(v)
        fraction, tail = float(tail[:n]), tail[n:]
    if tail not in _ZONES:
        raise ValueError(f"record times are UTC: {v!r}"[:120])
    return fraction


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def time_ok(v: Any) -> bool:
    """Whether `v` is a record time (parse_time reads it)."""
    try:
        parse_time(v)
        return True
    except ValueError:
        return False
