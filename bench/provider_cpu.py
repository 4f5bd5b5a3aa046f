"""What a message costs each HTTP provider in CPU (issue 27): `python -m bench.provider_cpu
[--n 1000 --rounds 5]`.

Brevo, Postmark, Resend, SendGrid and Mailgun each send `--n` emails rendered from the
`welcome` template (one To, a From name, one tag), built as `OutgoingEmail` values before
the clock starts, to a local stand-in on 127.0.0.1 that answers at once with the ESP's
success answer. The figure is this process's CPU time (`time.process_time`: user and
system, all threads) over the provider's own path, divided by `--n`: payload, JSON or
multipart encoding, the MIME where the provider sends it (Mailgun's `OutgoingEmail.raw`
is built inside its send, as in the worker), httpx and reading the answers. The stand-ins
run in processes of their own, so their CPU is never counted.

Two ways of sending, each a row:

- `batch`: as the worker sends a claim, cut in chunks of the provider's `max_batch_size`
  (Brevo 1,000, Postmark 500, Resend 100; SendGrid and Mailgun have no call that sends
  distinct messages, so 1), a chunk of one by `send` and any other by `send_batch`,
  IN_FLIGHT calls at a time.
- `one_by_one`: every email by `send` (each provider's keyed or single call), IN_FLIGHT at
  a time, the worker's path for a message retried after an ambiguous send.

Rounds interleave the providers (the order rotates each round, and the two ways swap), and
each figure's ratio is to Brevo's in the same round and way; the summary gives the median
and range over the rounds. Each segment is checked on the stand-in's side: every email
taken exactly once, nothing refused. Results: bench/results/provider_cpu.json.

The Brevo stand-in is bench/brevo_fake.py (`--delay 0`); the others share one, below
(`python -m bench.provider_cpu --serve PORT`): a bare ASGI function on uvicorn, like
brevo_fake, that checks the key each ESP authenticates with and records each email by our
message id (`X-Mailbag-Message-ID`, Postmark's Metadata, SendGrid's custom_args, Mailgun's
`v:` variable), with the same `/bench/records` and `/bench/reset` as brevo_fake, so
brevo_batch's `tally` counts both. tests/*_server.py are the thorough fakes that check
every request against the ESP's published spec; at hundreds of microseconds a request they
would set the pace here, not the client.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import itertools
import json
import re
import statistics
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.brevo_batch import API_KEY, brevo_fake, reset, tally
from bench.brevo_fake import MESSAGE_ID_HEADER, Receive, Scope, Send
from bench.common import ROOT, stand_in_process, welcome_emails
from mailbag.compose import OutgoingEmail
from mailbag.domain import delivery
from mailbag.providers.base import Provider
from mailbag.providers.brevo import BrevoProvider
from mailbag.providers.mailgun import MailgunProvider
from mailbag.providers.postmark import PostmarkProvider
from mailbag.providers.resend import ResendProvider
from mailbag.providers.sendgrid import SendGridProvider

RESULTS = ROOT / "bench" / "results" / "provider_cpu.json"
PROVIDERS = ("brevo", "postmark", "resend", "sendgrid", "mailgun")
MODES = ("batch", "one_by_one")
IN_FLIGHT = 8  # calls at once (and each provider's connection pool)
FROM_EMAIL = "bench@example.com"
MAILGUN_DOMAIN = "mg.example.com"
WARMUP = 20  # emails per provider and way before the first round: connections, caches

_MAILGUN_VARIABLE = re.compile(rb'name="v:mailbag-message-id"\r\n\r\n([^\r]+)\r\n')
_MAILGUN_AUTH = b"Basic " + base64.b64encode(f"api:{API_KEY}".encode())


# --- the stand-in for Postmark, Resend, SendGrid and Mailgun ------------------------------


def _postmark(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    key = body["Metadata"]["mailbag_message_id"]
    answer = {
        "To": body["To"],
        "SubmittedAt": "2026-01-01T12:00:00.0000000Z",
        "MessageID": str(uuid.uuid4()),
        "ErrorCode": 0,
        "Message": "OK",
    }
    return key, answer


class StandIn:
    """Each ESP's success answer, at once; see the module doc."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.calls: list[tuple[float, float, int, int]] = []  # as brevo_fake records them
        self.refused: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        raw = b"".join(chunks)
        received, before = time.time(), len(self.keys)
        status, reply, headers = self.answer(scope, raw)
        if len(self.keys) > before:  # a send call: when, how many emails, how large
            self.calls.append((received, time.time(), len(self.keys) - before, len(raw)))
        payload = orjson.dumps(reply) if reply is not None else b""
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json; charset=utf-8"),
                    (b"content-length", str(len(payload)).encode()),
                    *headers,
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    def answer(self, scope: Scope, raw: bytes) -> tuple[int, Any, list[tuple[bytes, bytes]]]:
        path, method = scope["path"], scope["method"]
        headers = dict(scope["headers"])
        if method == "GET" and path == "/bench/records":
            return 200, {"keys": self.keys, "calls": self.calls, "refused": self.refused}, []
        if method == "POST" and path == "/bench/reset":
            self.keys, self.calls, self.refused = [], [], []
            return 200, {}, []
        if method != "POST":
            return self.refuse(404, f"{method} {path}")
        bearer = headers.get(b"authorization") == f"Bearer {API_KEY}".encode()
        if path in ("/email", "/email/batch"):
            if headers.get(b"x-postmark-server-token") != API_KEY.encode():
                return self.refuse(401, "Postmark: bad server token")
            body = orjson.loads(raw)
            if path == "/email":
                key, answer = _postmark(body)
                self.keys.append(key)
                return 200, answer, []
            answers = []
            for item in body:
                key, answer = _postmark(item)
                self.keys.append(key)
                answers.append(answer)
            return 200, answers, []
        if path in ("/emails", "/emails/batch"):
            if not bearer:
                return self.refuse(401, "Resend: bad key")
            body = orjson.loads(raw)
            emails = body if path == "/emails/batch" else [body]
            self.keys += [email["headers"][MESSAGE_ID_HEADER] for email in emails]
            ids = [{"id": str(uuid.uuid4())} for _ in emails]
            return 200, ({"data": ids} if path == "/emails/batch" else ids[0]), []
        if path == "/v3/mail/send":
            if not bearer:
                return self.refuse(401, "SendGrid: bad key")
            body = orjson.loads(raw)
            self.keys.append(body["personalizations"][0]["custom_args"]["mailbag_message_id"])
            return 202, None, [(b"x-message-id", uuid.uuid4().hex[:22].encode())]
        if path == f"/v3/{MAILGUN_DOMAIN}/messages.mime":
            if headers.get(b"authorization") != _MAILGUN_AUTH:
                return self.refuse(401, "Mailgun: bad key")
            found = _MAILGUN_VARIABLE.search(raw)
            if found is None:
                return self.refuse(400, "Mailgun: no v:mailbag-message-id")
            self.keys.append(found[1].decode())
            taken = f"<{uuid.uuid4().hex}@{MAILGUN_DOMAIN}>"
            return 200, {"id": taken, "message": "Queued. Thank you."}, []
        return self.refuse(404, f"{method} {path}")

    def refuse(self, status: int, why: str) -> tuple[int, Any, list[tuple[bytes, bytes]]]:
        self.refused.append(f"{status} {why}")
        return status, {"message": why}, []


def serve(port: int) -> None:
    import uvicorn

    uvicorn.run(
        StandIn(),
        host="127.0.0.1",
        port=port,
        http="httptools",
        loop="uvloop",
        lifespan="off",
        access_log=False,
        log_level="warning",
    )


def stand_in() -> Any:
    """The stand-in in its own process; yields its base URL."""
    return stand_in_process("bench.provider_cpu", ["--serve={port}"], "/bench/records")


# --- the measured side ------------------------------------------------------------------


def outgoing(n: int) -> list[OutgoingEmail]:
    """N welcome emails as the worker composes them, to user0..user{N-1}@example.com."""
    return welcome_emails(0, n, from_email=FROM_EMAIL, tags=("welcome",))


def providers(brevo_url: str, url: str) -> dict[str, Provider]:
    api: dict[str, Any] = {"api_key": API_KEY, "timeout": 30.0, "max_connections": IN_FLIGHT}
    return {
        "brevo": BrevoProvider(base_url=brevo_url, **api),
        "postmark": PostmarkProvider(base_url=url, **api),
        "resend": ResendProvider(base_url=url, **api),
        "sendgrid": SendGridProvider(base_url=url, **api),
        "mailgun": MailgunProvider(base_url=url, domain=MAILGUN_DOMAIN, **api),
    }


async def send_all(
    provider: Provider, emails: Sequence[OutgoingEmail], mode: str
) -> list[delivery.SendOutcome]:
    """The emails sent one way (see the module doc), IN_FLIGHT calls at a time."""
    size = provider.max_batch_size if mode == "batch" else 1
    chunks = [emails[i : i + size] for i in range(0, len(emails), size)]
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(chunk: Sequence[OutgoingEmail]) -> list[delivery.SendOutcome]:
        async with gate:
            if len(chunk) == 1:  # as the worker does (worker.attempt)
                return [await provider.send(chunk[0])]
            return list(await provider.send_batch(chunk))

    results = await asyncio.gather(*(one(chunk) for chunk in chunks))
    return [outcome for outcomes in results for outcome in outcomes]


async def segment(provider: Provider, url: str, n: int, mode: str) -> dict[str, Any]:
    """One provider, one way, N fresh emails: CPU per message, and what the stand-in took."""
    emails = outgoing(n)
    reset(url)
    gc.collect()  # the previous segment's garbage is not this one's to collect
    started, cpu = time.time(), time.process_time()
    outcomes = await send_all(provider, emails, mode)
    cpu = time.process_time() - cpu
    refused = [o for o in outcomes if not isinstance(o, delivery.Accepted)]
    if refused:
        raise RuntimeError(f"{provider.name} did not send {len(refused)}: {refused[:3]}")
    aliases = {str(e.message_id): e.to_email for e in emails}  # brevo records a version by To
    took = tally(url, {e.to_email for e in emails}, started, aliases)
    return {
        "cpu_us_per_message": round(cpu / n * 1e6, 1),
        "calls": took["calls"],
        "emails_per_call": took["versions_per_call"],
        "kib_per_call": took["kib_per_call"],
        "duplicates": took["duplicates"],
        "missing": took["missing"],
        "unexpected": took["unexpected"],
    }


def order(number: int) -> list[tuple[str, str]]:
    """Round `number`'s (way, provider) segments: the providers rotated by one each round
    (in five rounds each runs first once, and last once), the two ways in turn."""
    shift = number % len(PROVIDERS)
    names = PROVIDERS[shift:] + PROVIDERS[:shift]
    modes = MODES if number % 2 == 0 else MODES[::-1]
    return [(mode, name) for mode in modes for name in names]


async def measure(brevo_url: str, url: str, n: int, rounds: int) -> list[dict[str, Any]]:
    found = providers(brevo_url, url)
    where = {name: brevo_url if name == "brevo" else url for name in PROVIDERS}
    try:
        for mode, name in order(0):
            await segment(found[name], where[name], WARMUP, mode)
        rows = []
        for number in range(rounds):
            measured = {}
            for mode, name in order(number):
                measured[mode, name] = await segment(found[name], where[name], n, mode)
            for (mode, name), figures in measured.items():
                brevo = measured[mode, "brevo"]["cpu_us_per_message"]
                ratio = figures["cpu_us_per_message"] / brevo
                rows.append(
                    {"round": number + 1, "mode": mode, "provider": name, **figures}
                    | {"ratio_to_brevo": round(ratio, 3)}
                )
        return rows
    finally:
        for provider in found.values():
            await provider.aclose()


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per way and provider: the median and range of CPU per message and of the ratio."""
    out: dict[str, dict[str, Any]] = {}
    for mode, name in itertools.product(MODES, PROVIDERS):
        mine = [r for r in rows if (r["mode"], r["provider"]) == (mode, name)]
        if not mine:
            continue
        cpu = [r["cpu_us_per_message"] for r in mine]
        ratio = [r["ratio_to_brevo"] for r in mine]
        out.setdefault(mode, {})[name] = {
            "median_us": statistics.median(cpu),
            "range_us": [min(cpu), max(cpu)],
            "ratio_to_brevo": {
                "median": statistics.median(ratio),
                "range": [min(ratio), max(ratio)],
            },
            "emails_per_call": mine[0]["emails_per_call"],
        }
    return out


def run(n: int = 1000, rounds: int = 5) -> dict[str, Any]:
    with brevo_fake(delay=0) as brevo_url, stand_in() as url:
        rows = asyncio.run(measure(brevo_url, url, n, rounds))
    return {
        "n": n,
        "rounds": rounds,
        "in_flight": IN_FLIGHT,
        "rows": rows,
        "summary": summary(rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="emails per provider and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the results go")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return
    result = run(args.n, args.rounds)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for mode, by_name in result["summary"].items():
        print(f"{mode}:")
        for name, part in by_name.items():
            low, high = part["range_us"]
            ratio = part["ratio_to_brevo"]
            print(
                f"  {name:9} {part['median_us']:7.1f} µs a message ({low:.1f}-{high:.1f}), "
                f"{ratio['median']:.2f}x Brevo ({ratio['range'][0]:.2f}-{ratio['range'][1]:.2f})"
            )


if __name__ == "__main__":
    main()
