"""A Brevo stand-in for the batch benchmark: a real HTTP server in its own process that
checks each `POST /v3/smtp/email` as Brevo does, waits a fixed time, and answers as Brevo
does.

    python -m bench.brevo_fake --port 8025 --api-key KEY --delay 0.1

What it checks, from Brevo's published spec (/work/shared/reference, `sendSmtpEmail`): the
`api-key` header (else 401 `unauthorized`); a JSON object with no unknown field; a
`sender` with an email; a subject and an htmlContent or textContent (no templateId here);
`headers` of strings, an `idempotencyKey` among them a UUID; `tags` strings. A single
send has a non-empty `to`; a batch has 1 to 1000 `messageVersions` and no outer `to`,
each version a non-empty `to` and only the fields a version may have, at most 99
recipients (To, Cc, Bcc) a version and 2000 a request. Every address has an ASCII
(`format: email`) email and a name of at most 70 characters. A request that fails any
check is answered 400 (`invalid_parameter` or `missing_parameter`) and takes nothing.
Otherwise, after `--delay` seconds, 201 with `messageId` or `messageIds` (one per
version, in order), ids shaped like Brevo's.

What it took is recorded, for the benchmark to count duplicates and missing: per email, the
`X-Mailbag-Message-ID` header of a single send, else (a message version carries no
headers) the version's first To address, which the benchmark maps back to its message;
per call, when it came, when it was answered and how many emails it held.
`GET /bench/records` returns them, `GET /bench/count` how many emails and refusals, and
`POST /bench/reset` forgets them.

The server is a bare ASGI function on uvicorn (httptools, uvloop): the stand-in must cost
far less than the client it measures, so no framework routing and no per-field schema
walk; the checks are written out once below, for the shapes mailbag and the ceiling send.
tests/brevo_server.py is the thorough, threaded fake the provider's tests use.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

SEND_PATH = "/v3/smtp/email"
MAX_VERSIONS = 1000
MAX_RECIPIENTS_PER_VERSION = 99
MAX_RECIPIENTS_PER_CALL = 2000
MAX_NAME = 70
MESSAGE_ID_HEADER = "X-Mailbag-Message-ID"

TOP_FIELDS = frozenset(
    {
        "sender", "to", "bcc", "cc", "htmlContent", "textContent", "subject", "replyTo",
        "attachment", "headers", "templateId", "params", "messageVersions", "tags",
        "scheduledAt", "batchId",
    }
)  # fmt: skip
VERSION_FIELDS = frozenset(
    {"to", "params", "bcc", "cc", "replyTo", "subject", "htmlContent", "textContent"}
)
# JSON Schema's `email` format: ASCII dot-atom local part, LDH labels (punycode included).
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
EMAIL = re.compile(rf"{_ATEXT}(?:\.{_ATEXT})*@{_LABEL}(?:\.{_LABEL})+")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Invalid(Exception):
    def __init__(self, message: str, code: str = "invalid_parameter") -> None:
        super().__init__(message)
        self.code = code


def _address(value: Any, where: str) -> str:
    """An address object's email, checked with its name."""
    if not isinstance(value, dict) or not isinstance(value.get("email"), str):
        raise Invalid(f"{where}.email is missing", "missing_parameter")
    if set(value) - {"email", "name"}:
        raise Invalid(f"{where}: unknown {sorted(set(value) - {'email', 'name'})}")
    email: str = value["email"]
    if len(email) > 254 or not EMAIL.fullmatch(email):
        raise Invalid(f"email is not valid in {where}")
    name = value.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME):
        raise Invalid(f"{where}.name must be a string of at most {MAX_NAME} characters")
    return email


def _addresses(value: Any, where: str, *, required: bool = False) -> list[str]:
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        raise Invalid(f"{where} is missing or empty", "missing_parameter")
    return [_address(item, f"{where}[{i}]") for i, item in enumerate(value)]


def _string(value: Any, where: str) -> None:
    if value is not None and not isinstance(value, str):
        raise Invalid(f"{where} must be of type string")


def validate(body: Any) -> list[dict[str, Any]]:
    """Check a send as Brevo does; return its emails as versions (a single send is one,
    its outer `to`). Raises Invalid."""
    if not isinstance(body, dict):
        raise Invalid("Input must be a JSON object")
    if set(body) - TOP_FIELDS:
        raise Invalid(f"body: unknown {sorted(set(body) - TOP_FIELDS)}")
    sender = body.get("sender")
    if not isinstance(sender, dict) or "email" not in sender:
        raise Invalid("sender is missing or its email is not valid", "missing_parameter")
    _address({k: v for k, v in sender.items() if k != "id"}, "sender")
    if "templateId" in body:
        raise Invalid("templateId: this stand-in serves sends with their own content")
    for name in ("subject", "htmlContent", "textContent"):
        _string(body.get(name), name)
    if not body.get("subject"):
        raise Invalid("subject is missing", "missing_parameter")
    # A version may then carry either body ("htmlContent and textContent can be
    # customized only if any of the two ... is present in global parameters").
    if not body.get("htmlContent") and not body.get("textContent"):
        raise Invalid("htmlContent or textContent is missing", "missing_parameter")
    headers = body.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise Invalid("headers must be an object of strings")
    if "idempotencyKey" in headers:
        try:
            uuid.UUID(headers["idempotencyKey"])
        except ValueError:
            raise Invalid("idempotencyKey must be a valid UUID") from None
    tags = body.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise Invalid("tags must be an array of strings")
    if body.get("attachment"):
        raise Invalid("attachment: this stand-in serves sends without attachments")
    if "replyTo" in body:
        _address(body["replyTo"], "replyTo")
    outer = len(_addresses(body.get("cc"), "cc")) + len(_addresses(body.get("bcc"), "bcc"))

    if "messageVersions" not in body:
        count = len(_addresses(body.get("to"), "to", required=True)) + outer
        if count > MAX_RECIPIENTS_PER_CALL:
            raise Invalid(f"at most {MAX_RECIPIENTS_PER_CALL} recipients per request")
        return [{"to": body["to"]}]
    if "to" in body:
        raise Invalid("to must not be passed with messageVersions")
    versions = body["messageVersions"]
    if not isinstance(versions, list) or not 1 <= len(versions) <= MAX_VERSIONS:
        raise Invalid(f"messageVersions must hold 1 to {MAX_VERSIONS} versions")
    total = 0
    for number, version in enumerate(versions):
        where = f"messageVersions[{number}]"
        if not isinstance(version, dict):
            raise Invalid(f"{where} must be of type object")
        if set(version) - VERSION_FIELDS:
            raise Invalid(f"{where}: unknown {sorted(set(version) - VERSION_FIELDS)}")
        count = len(_addresses(version.get("to"), f"{where}.to", required=True))
        for kind in ("cc", "bcc"):  # a version's own replaces the call's
            count += len(_addresses(version.get(kind, body.get(kind)), f"{where}.{kind}"))
        if "replyTo" in version:
            _address(version["replyTo"], f"{where}.replyTo")
        for name in ("subject", "htmlContent", "textContent"):
            _string(version.get(name), f"{where}.{name}")
        if count > MAX_RECIPIENTS_PER_VERSION:
            raise Invalid(f"{where}: at most {MAX_RECIPIENTS_PER_VERSION} recipients")
        total += count
    if total > MAX_RECIPIENTS_PER_CALL:
        raise Invalid(f"at most {MAX_RECIPIENTS_PER_CALL} recipients per request")
    return versions


class Fake:
    def __init__(self, api_key: str, delay: float) -> None:
        self.api_key = api_key.encode()
        self.delay = delay
        self.keys: list[str] = []  # one per email taken, see the module doc
        # (received, answered, emails, body bytes) per call taken
        self.calls: list[tuple[float, float, int, int]] = []
        self.refused: list[str] = []  # the reasons of answers other than 201
        self.counter = itertools.count(1)

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
        path, method = scope["path"], scope["method"]
        if path == SEND_PATH and method == "POST":
            status, reply = await self.send(scope, raw)
        elif path == "/bench/count" and method == "GET":  # cheap enough to poll
            status, reply = 200, {"emails": len(self.keys), "refused": len(self.refused)}
        elif path == "/bench/records" and method == "GET":
            status, reply = 200, {"keys": self.keys, "calls": self.calls, "refused": self.refused}
        elif path == "/bench/reset" and method == "POST":
            self.keys, self.calls, self.refused = [], [], []
            status, reply = 200, {}
        else:
            status, reply = 404, {"code": "not_found", "message": "Invalid route"}
        payload = json.dumps(reply).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json; charset=utf-8"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    async def send(self, scope: Scope, raw: bytes) -> tuple[int, dict[str, Any]]:
        received = time.time()
        headers = dict(scope["headers"])
        if headers.get(b"api-key") != self.api_key:
            return self.refuse(401, "unauthorized", "Key not found")
        try:
            body = json.loads(raw)
        except ValueError:
            return self.refuse(400, "bad_request", "the body is not JSON")
        try:
            versions = validate(body)
        except Invalid as exc:
            return self.refuse(400, exc.code, str(exc))
        await asyncio.sleep(self.delay)
        ours = body.get("headers", {}).get(MESSAGE_ID_HEADER)
        if "messageVersions" in body or ours is None:
            self.keys += [version["to"][0]["email"] for version in versions]
        else:
            self.keys.append(ours)
        stamp = time.strftime("%Y%m%d%H%M%S")
        ids = [f"<{stamp}.{next(self.counter):011d}@smtp-relay.mailin.fr>" for _ in versions]
        self.calls.append((received, time.time(), len(versions), len(raw)))
        if "messageVersions" in body:
            return 201, {"messageIds": ids}
        return 201, {"messageId": ids[0]}

    def refuse(self, status: int, code: str, message: str) -> tuple[int, dict[str, Any]]:
        self.refused.append(f"{status} {code}: {message}")
        return status, {"code": code, "message": message}


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m bench.brevo_fake", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--delay", type=float, default=0.1, help="seconds before each answer")
    args = parser.parse_args()
    uvicorn.run(
        Fake(args.api_key, args.delay),
        host="127.0.0.1",
        port=args.port,
        http="httptools",
        loop="uvloop",
        lifespan="off",
        access_log=False,
        log_level="warning",
        backlog=4096,
    )


if __name__ == "__main__":
    main()
