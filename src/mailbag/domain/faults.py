"""The faults the `faults` test provider answers with (providers/faults.py), and which one
comes next: a script (answers in order, one per email), then rates. Pure: the provider
brings the random.Random, so a seed gives the same answers every run.

A *request* is one `send` or `send_batch` call. What a real provider says about a whole
request (it timed out after taking it, 429, 5xx, the connection was refused) is drawn once
per request and holds for each of its emails; what it says about one email (refused,
deferred) is drawn per email of a request it took; `batch_partial` refuses a random part
(never all, never none) of a batch request of two or more.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from enum import StrEnum


class Fault(StrEnum):
    ACCEPT = "accept"
    # About the whole request.
    TIMEOUT_AFTER_ACCEPT = "timeout_after_accept"  # taken, then no answer: Ambiguous
    THROTTLE = "throttle"  # 429 before taking anything
    SERVER_ERROR = "server_error"  # 5xx before taking anything
    REFUSE_CONNECTION = "refuse_connection"  # never reached
    # About one email.
    REJECT = "reject"  # refused for good (an invalid recipient, content it refuses)
    DEFER = "defer"  # a 4xx about the message itself (a full mailbox): its attempt is spent
    # A rate only: some emails of a batch refused (reject or defer), the others taken.
    BATCH_PARTIAL = "batch_partial"


REQUEST_FAULTS = (
    Fault.TIMEOUT_AFTER_ACCEPT,
    Fault.THROTTLE,
    Fault.SERVER_ERROR,
    Fault.REFUSE_CONNECTION,
)
EMAIL_FAULTS = (Fault.REJECT, Fault.DEFER)
RATE_NAMES = (*REQUEST_FAULTS, Fault.BATCH_PARTIAL, *EMAIL_FAULTS)
SCRIPT_NAMES = tuple(f for f in Fault if f is not Fault.BATCH_PARTIAL)

Rates = Mapping[Fault, float]


class InvalidFaults(ValueError):
    """A rate or a script entry that cannot be used; the message names it."""


def parse_rates(rates: str | Mapping[str, float] | None) -> dict[Fault, float]:
    """`"throttle=0.1,server_error=0.05"` (or a mapping) as rates: each a name of
    RATE_NAMES and a number from 0 to 1; the request faults and batch_partial together at
    most 1, and reject and defer together at most 1 (each is one draw)."""
    if rates is None:
        return {}
    pairs: Iterable[tuple[str, str | float]]
    if isinstance(rates, str):
        pairs = [_pair(item) for item in rates.split(",") if item.strip()]
    else:
        pairs = rates.items()
    parsed: dict[Fault, float] = {}
    for name, value in pairs:
        fault = _named(name, RATE_NAMES, "a rate")
        if fault in parsed:
            raise InvalidFaults(f"{fault} is given twice")
        parsed[fault] = _rate(fault, value)
    for group in ((*REQUEST_FAULTS, Fault.BATCH_PARTIAL), EMAIL_FAULTS):
        total = sum(parsed.get(f, 0.0) for f in group)
        if total > 1 + 1e-9:  # 0.3+0.3+0.4 is 1.0000000000000002 in floats
            names = "+".join(f for f in group if f in parsed)
            raise InvalidFaults(f"{names} add up to {total:g}, more than 1")
    return parsed


def parse_script(script: str | Iterable[str] | None) -> tuple[Fault, ...]:
    """`"throttle,accept,timeout_after_accept"` (or a sequence) as a script of SCRIPT_NAMES."""
    if script is None:
        return ()
    if isinstance(script, str):
        if not script.strip():
            return ()
        script = script.split(",")
    return tuple(_named(item, SCRIPT_NAMES, "a script entry") for item in script)


def check_setting(name: str, value: str) -> None:
    """The settings' check of FAULTS_RATES, FAULTS_SCRIPT and FAULTS_INNER (by field name):
    ValueError saying what is wrong."""
    if name == "faults_rates":
        parse_rates(value)
    elif name == "faults_script":
        parse_script(value)
    elif name == "faults_inner" and value.strip().lower() == "faults":
        raise InvalidFaults("must name the provider the faults wrap (capture, file, ...)")


def _pair(item: str) -> tuple[str, str]:
    name, equals, value = item.partition("=")
    if not equals:
        raise InvalidFaults(f"{item.strip()!r} is no name=rate (e.g. throttle=0.1)")
    return name, value


def _named(name: str, allowed: tuple[Fault, ...], what: str) -> Fault:
    text = name.strip().lower()
    fault = next((f for f in allowed if f.value == text), None)
    if fault is not None:
        return fault
    if text == Fault.BATCH_PARTIAL:
        raise InvalidFaults(
            "batch_partial is a rate; in a script each email of a batch takes its own entry "
            "(accept,reject is a partial batch of two)"
        )
    raise InvalidFaults(
        f"{name.strip()!r} is not {what}; one of: {', '.join(f.value for f in allowed)}"
    )


def _rate(fault: Fault, value: str | float) -> float:
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise InvalidFaults(f"{fault}: {str(value).strip()!r} is not a number") from None
    if not 0 <= rate <= 1:
        raise InvalidFaults(f"{fault}: {rate:g} is not a rate from 0 to 1")
    return rate


class Plan:
    """The answers to come: the script's entries in order, one per email, then the rates
    (none given: every email is accepted)."""

    def __init__(self, rates: Rates, script: tuple[Fault, ...], rng: random.Random) -> None:
        self.rates, self.script, self.rng = dict(rates), script, rng
        self.played = 0  # script entries used

    def answers(self, size: int) -> list[Fault]:
        """One answer for each email of a request of `size` emails."""
        scripted = list(self.script[self.played : self.played + size])
        self.played += len(scripted)
        left = size - len(scripted)
        return scripted + (self._drawn(left) if left else [])

    def _drawn(self, size: int) -> list[Fault]:
        whole = self._pick((*REQUEST_FAULTS, Fault.BATCH_PARTIAL))
        if whole is Fault.BATCH_PARTIAL and size >= 2:
            refused = set(self.rng.sample(range(size), self.rng.randint(1, size - 1)))
            return [
                self.rng.choice(EMAIL_FAULTS) if i in refused else Fault.ACCEPT for i in range(size)
            ]
        if whole is not None and whole is not Fault.BATCH_PARTIAL:
            return [whole] * size
        return [self._pick(EMAIL_FAULTS) or Fault.ACCEPT for _ in range(size)]

    def _pick(self, faults: tuple[Fault, ...]) -> Fault | None:
        """One draw: a fault of `faults` by its rate, or None (no fault)."""
        if not any(self.rates.get(f) for f in faults):
            return None  # no draw: a plan without rates uses no randomness
        draw, ceiling = self.rng.random(), 0.0
        for fault in faults:
            ceiling += self.rates.get(fault, 0.0)
            if draw < ceiling:
                return fault
        return None
