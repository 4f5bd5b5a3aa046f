"""Who may use the console: the admin password, a signed session cookie, CSRF tokens.

Nothing is stored on the server. The session lives in a cookie signed with a key derived
from ADMIN_PASSWORD, so sessions survive a restart and all end when the password changes.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import Response

PATH = "/admin"
SESSION_COOKIE = "mailbag_console"
FLASH_COOKIE = "mailbag_console_flash"
SESSION_SECONDS = 8 * 3600
FLASH_SECONDS = 60


@dataclass(frozen=True)
class Session:
    csrf: str  # sent back in every form; an attacker's page can neither read nor guess it
    authenticated: bool


def _digest(value: str) -> bytes:
    # Equal-length digests, so compare_digest's time does not depend on the password's length.
    return hashlib.sha256(value.encode()).digest()


class Gate:
    def __init__(self, password: str) -> None:
        self._password_digest = _digest(password)
        key = hmac.new(password.encode(), b"mailbag console session key v1", "sha256").digest()
        self._sessions = URLSafeTimedSerializer(key, salt="mailbag.console.session")
        self._flashes = URLSafeTimedSerializer(key, salt="mailbag.console.flash")

    def password_matches(self, submitted: str) -> bool:
        return hmac.compare_digest(_digest(submitted), self._password_digest)

    @staticmethod
    def new_session(*, authenticated: bool) -> Session:
        # A fresh token on every login: a token seen before it (login CSRF) is worth nothing.
        return Session(csrf=secrets.token_urlsafe(32), authenticated=authenticated)

    @staticmethod
    def csrf_matches(session: Session, submitted: str | None) -> bool:
        return submitted is not None and hmac.compare_digest(
            submitted.encode(), session.csrf.encode()
        )

    def read(self, request: Request) -> Session | None:
        raw = request.cookies.get(SESSION_COOKIE)
        if not raw:
            return None
        try:
            data = self._sessions.loads(raw, max_age=SESSION_SECONDS)
        except BadSignature:  # also covers an expired signature
            return None
        if not isinstance(data, dict) or not isinstance(data.get("csrf"), str):
            return None
        return Session(csrf=data["csrf"], authenticated=data.get("auth") is True)

    def write(self, request: Request, response: Response, session: Session) -> None:
        value = self._sessions.dumps({"csrf": session.csrf, "auth": session.authenticated})
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


def forget(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path=PATH)


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
