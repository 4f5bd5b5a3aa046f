"""A real local SMTP server for the benchmarks, in its own process: accepts everything and
notes "<Message-ID> <unix time>" per message in a file, so the harness can count
deliveries and duplicates.

    python -m bench.smtp_sink PORT OUTFILE
"""

from __future__ import annotations

import asyncio
import sys
import time
from email.parser import BytesHeaderParser
from typing import Any

from aiosmtpd.controller import Controller

_parser = BytesHeaderParser()


class Recorder:
    def __init__(self, path: str) -> None:
        self.out = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the server

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message_id = _parser.parsebytes(envelope.original_content or b"").get("Message-ID", "-")
        self.out.write(f"{message_id.strip()} {time.time():.6f}\n")
        return "250 2.0.0 Ok: queued"


def main() -> None:
    port, path = int(sys.argv[1]), sys.argv[2]
    controller = Controller(Recorder(path), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        asyncio.run(asyncio.Event().wait())
    finally:
        controller.stop()


if __name__ == "__main__":
    main()
