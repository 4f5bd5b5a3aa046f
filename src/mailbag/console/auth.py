"""Who may use the console: the admin password, server-side sessions, CSRF tokens.

Cookies are signed with a subkey of the deployment key (`keys.derive(key,
"console-session")`), never with anything derived from the password: what a visitor is
given (the login form's signed CSRF token) tells nothing about the password, so guesses can
only be tried online, where they are throttled.

A logged-in session is a row in `console_sessions`, found by the digest of a random secret
the cookie carries. Logout deletes the row, which ends the session on every API replica at
once. Each row also holds a fingerprint of the admin password (an HMAC under the deployment
key, useless for guessing without that key): a new ADMIN_PASSWORD ends every session.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import Response

from mailbag import keys
from mailbag.store import console_sessions
from mailbag.store.session import AsyncDatabase
from mailbag.web import services

PATH = "/admin"
SESSION_COOKIE = "mailbag_console"
FLASH_COOKIE = "mailbag_console_flash"
SESSION_SECONDS = 8 * 3600
FLASH_SECONDS = 60


@dataclass(frozen=True)
class ConsoleSession:
    csrf: str  # sent back in every form; an attacker's page can neither read nor guess it
    # The cookie's session secret, set once logged in; its digest names the database row.
    secret: str | None = None

    @property
    def authenticated(self) -> bool:
        return self.secret is not None


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class Gate:
    def __init__(self, password: str, key: bytes) -> None:
        self._fingerprint_key = keys.derive(key, "console-password")
        self._password_fingerprint = self.fingerprint(password)
        signing_key = keys.derive(key, "console-session")
        self._sessions = URLSafeTimedSerializer(signing_key, salt="mailbag.console.session")
        self._flashes = URLSafeTimedSerializer(signing_key, salt="mailbag.console.flash")

    def fingerprint(self, password: str) -> str:
        value = password.encode("utf-8", "surrogatepass")
        return hmac.new(self._fingerprint_key, value, hashlib.sha256).hexdigest()

    def password_matches(self, submitted: str | None) -> bool:
        # Equal-length HMACs: the comparison's time says nothing about the password.
        return bool(submitted) and hmac.compare_digest(
            self.fingerprint(submitted or ""), self._password_fingerprint
        )

    @staticmethod
    def anonymous() -> ConsoleSession:
        """A visitor's session: only the login form's CSRF token, nothing on the server."""
        return ConsoleSession(csrf=secrets.token_urlsafe(32))

    @staticmethod
    def csrf_matches(session: ConsoleSession, submitted: str | None) -> bool:
        return submitted is not None and hmac.compare_digest(
            submitted.encode(), session.csrf.encode()
        )

    async def read(self, request: Request) -> ConsoleSession | None:
        """The cookie's session; None if there is none, or it was ended, or it expired."""
        raw = request.cookies.get(SESSION_COOKIE)
        if not raw:
            return None
        try:
            data = self._sessions.loads(raw, max_age=SESSION_SECONDS)
        except BadSignature:  # also covers an expired signature
            return None
        if not isinstance(data, dict) or not isinstance(data.get("csrf"), str):
            return None
        secret = data.get("sid")
        if secret is None:
            return ConsoleSession(csrf=data["csrf"])
        if not isinstance(secret, str):
            return None
        svc = services(request)
        async with AsyncDatabase(svc.engine).connect(read_only=True) as reading:
            live = await reading.run(
                console_sessions.is_live(
                    _digest(secret), self._password_fingerprint, now=svc.clock()
                )
            )
        return ConsoleSession(csrf=data["csrf"], secret=secret) if live else None

    async def log_in(self, request: Request, response: Response) -> ConsoleSession:
        """A new server-side session (and a new CSRF token: one seen before the login, as
        in login CSRF, is worth nothing), written to the response's cookie."""
        secret = secrets.token_urlsafe(32)
        session = ConsoleSession(csrf=secrets.token_urlsafe(32), secret=secret)
        svc = services(request)
        now = svc.clock()
        async with AsyncDatabase(svc.engine).transaction() as tx:
            await tx.run(
                console_sessions.start(
                    _digest(secret),
                    self._password_fingerprint,
                    now=now,
                    expires_at=now + timedelta(seconds=SESSION_SECONDS),
                )
            )
        self.write(request, response, session)
        return session

    async def log_out(self, request: Request, response: Response, session: ConsoleSession) -> None:
        if session.secret is not None:
            svc = services(request)
            async with AsyncDatabase(svc.engine).transaction() as tx:
                await tx.run(console_sessions.end(_digest(session.secret)))
        response.delete_cookie(SESSION_COOKIE, path=PATH)

    def write(self, request: Request, response: Response, session: ConsoleSession) -> None:
        # "sid": the session secret, null before login.
        value = self._sessions.dumps({"csrf": session.csrf, "sid": session.secret})
        _set_cookie(request, response, SESSION_COOKIE, value, SESSION_SECONDS)

    def read_flash(self, request: Request) -> str | None:
        """The message an action left for the page after its redirect."""
        raw = request.cookies.get(FLASH_COOKIE)
        if not raw:
            return None
        try:
            text = self._flashes.loads(raw, max_age=FLASH_SECONDS)
        except BadSignature:
            return None
        return text if isinstance(text, str) else None

    def set_flash(self, request: Request, response: Response, text: str) -> None:
        # Signed, so nobody can make the console announce an action that never happened.
        _set_cookie(request, response, FLASH_COOKIE, self._flashes.dumps(text), FLASH_SECONDS)


def forget_flash(response: Response) -> None:
    """A flash is shown once: the page that shows it deletes it."""
    response.delete_cookie(FLASH_COOKIE, path=PATH)


def _set_cookie(request: Request, response: Response, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=PATH,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )
