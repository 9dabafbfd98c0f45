"""Cron schedules as a CronJob takes them, checked before the API server sees them.

The API server refuses a CronJob whose schedule it cannot parse (the whole apply fails), so
the operator parses `spec.backup.schedule` itself first, with errors that name the field
and the part at fault, and never applies a schedule it would refuse. It also needs the
schedule's longest gap between two runs: the backup alert fires when the last success is
older than a multiple of it.

The grammar is the one Kubernetes' CronJob controller uses (robfig/cron's standard parser):
five fields (minute, hour, day of month, month, day of week 0-6), each `*`, `?`, a number or
name, a range `a-b`, a step `/n` and comma lists, and the descriptors `@yearly`,
`@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`. When both day fields
are restricted, a day matches either (vixie cron's rule); when one is `*`, the other alone.
"""

import itertools
from dataclasses import dataclass
from datetime import date, timedelta

_DESCRIPTORS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (name, lowest, highest, names starting at `lowest`)
_FIELDS = (("minute", 0, 59, ()), ("hour", 0, 23, ()), ("day of month", 1, 31, ()),
           ("month", 1, 12, _MONTHS), ("day of week", 0, 6, _DAYS))
# A February 29th schedule runs every four years, eight across a skipped leap year (2100).
_HORIZON_DAYS = 8 * 366 + 2


@dataclass(frozen=True)
class Schedule:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]  # of the month
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # the day-of-month field is `*` (or `?`)
    any_weekday: bool

    def runs_on(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        by_date = day.day in self.days
        by_weekday = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return by_date and by_weekday
        return by_date or by_weekday


def _value(text: str, field: str, low: int, high: int, names: tuple[str, ...]) -> int:
    if text.lower() in names:
        return low + names.index(text.lower())
    if not text.isdigit():
        raise ValueError(f"{field}: {text!r} is not a number"
                         + (f" or a name ({', '.join(names)})" if names else ""))
    number = int(text)
    if not low <= number <= high:
        raise ValueError(f"{field}: {number} is outside {low}-{high}")
    return number


def _field(text: str, field: str, low: int, high: int, names: tuple[str, ...]
           ) -> tuple[frozenset[int], bool]:
    """The values a field selects, and whether it is the unrestricted `*`."""
    values: set[int] = set()
    star = False
    for part in text.split(","):
        span, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ValueError(f"{field}: step {step_text!r} in {part!r} is not a"
                                 f" positive number")
            step = int(step_text)
        if span in ("*", "?"):
            first, last = low, high
            star = star or step == 1
        elif "-" in span:
            start, _, end = span.partition("-")
            first = _value(start, field, low, high, names)
            last = _value(end, field, low, high, names)
            if first > last:
                raise ValueError(f"{field}: range {span!r} runs backwards")
        else:
            first = _value(span, field, low, high, names)
            last = high if slash else first  # "5/15": from 5 to the end, every 15
        values.update(range(first, last + 1, step))
    return frozenset(values), star


def parse(text: str) -> Schedule:
    """The schedule, or ValueError saying which field is wrong and why."""
    expression = text.strip()
    if expression.startswith("@"):
        if expression.lower() not in _DESCRIPTORS:
            raise ValueError(f"unknown descriptor {expression!r} (one of"
                             f" {', '.join(_DESCRIPTORS)})")
        expression = _DESCRIPTORS[expression.lower()]
    parts = expression.split()
    if len(parts) != len(_FIELDS):
        raise ValueError(f"{len(parts)} field(s) where cron wants 5: minute hour"
                         f" day-of-month month day-of-week (e.g. '0 3 * * *')")
    parsed = [_field(part, *spec) for part, spec in zip(parts, _FIELDS, strict=True)]
    (minutes, _), (hours, _), (days, any_day), (months, _), (weekdays, any_weekday) = parsed
    schedule = Schedule(minutes, hours, days, months, weekdays, any_day, any_weekday)
    if not run_days(schedule, date(2000, 1, 1), 2):
        raise ValueError("it never runs (no such day in any year)")
    return schedule


def run_days(schedule: Schedule, start: date, limit: int) -> list[date]:
    """The first `limit` days from `start` on which the schedule runs, within eight years."""
    found: list[date] = []
    for offset in range(_HORIZON_DAYS):
        day = start + timedelta(days=offset)
        if schedule.runs_on(day):
            found.append(day)
            if len(found) == limit:
                break
    return found


def longest_gap(schedule: Schedule, start: date) -> int:
    """The longest time in seconds between two consecutive runs over the next eight years
    from `start` (UTC, as the controller-manager runs CronJobs by default): what a backup
    may age by before it is late."""
    times = sorted(hour * 60 + minute for hour in schedule.hours for minute in schedule.minutes)
    days = run_days(schedule, start, _HORIZON_DAYS)
    if len(days) < 2:
        return _HORIZON_DAYS * 86400
    gap = max((later - earlier for earlier, later in itertools.pairwise(times)), default=0)
    for earlier, later in itertools.pairwise(days):
        gap = max(gap, (later - earlier).days * 1440 + times[0] - times[-1])
    return gap * 60
