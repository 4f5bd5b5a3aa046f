"""A deadline on each request's work: a database that stops answering is a prompt 503.

Driver and server timeouts (store/database.py) cover a database that refuses, resets or
stays silent on the wire, but not one whose bytes vanish into a network that still
acknowledges them (a hung proxy, a half-dead load balancer): only the caller's own clock
sees that. So every HTTP request gets DATABASE_TIMEOUT_SECONDS from the moment the app
starts on it. The body has been read by then (BodyLimit, outside this middleware, reads it
whole first), so a slow upload is not taken for a database outage. Past that, before any
byte of the answer left, the request is abandoned (its database work cancelled without
waiting, see `database.abandon`) and answered 503 with Retry-After. A client that retries
a POST with its Idempotency-Key gets the first answer if the abandoned work had committed
after all.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mailbag.api.problems import database_unavailable
from mailbag.store.database import abandon, wait_done


class DatabaseDeadline:
    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app, self.seconds = app, seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        answering = False  # the answer has begun: it is let through, however long it takes
        given_up = False

        async def guarded_send(message: Message) -> None:
            nonlocal answering
            if given_up:  # too late: the client already has its 503
                return
            answering = True
            await send(message)

        work = asyncio.ensure_future(self.app(scope, receive, guarded_send))
        try:
            done = await wait_done(work, self.seconds)
            if not done and answering:
                await asyncio.wait({work})
            elif not done:
                given_up = True
                abandon(work)
                answer = database_unavailable(f"no answer within {self.seconds:g} s")
                await answer.response()(scope, receive, send)
                return
        except asyncio.CancelledError:
            abandon(work)
            raise
        work.result()  # the app's own exceptions go on to the outer middleware
