"""A real DNS server on loopback for the tests (dnslib's), answering A and AAAA queries
from a table the test changes at will: a name can point at a public address at one lookup
and at this machine at the next, as a rebinding attacker's server would.

    with DnsServer({"hooks.example.com": ["127.0.0.1"]}) as dns:   # udp 127.0.0.1:<port>
        dns.records["hooks.example.com"] = ["10.0.0.7"]
        settings(dns_nameservers=dns.nameservers)

TXT records (sender domains) are a table of their own, `txt` (a value longer than 255
bytes goes out as several strings, as DNS carries it); a name in `failing` is answered
SERVFAIL, one in `silent` never (the asker times out). A name in neither table is
NXDOMAIN; `queries` counts the questions asked, by name.
"""

from __future__ import annotations

import time
from collections import Counter
from ipaddress import ip_address
from typing import Any

from dnslib import AAAA, QTYPE, RCODE, RR, TXT, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer


class DnsServer:
    def __init__(self, records: dict[str, list[str]] | None = None) -> None:
        self.records: dict[str, list[str]] = dict(records or {})
        self.txt: dict[str, list[str]] = {}
        self.failing: set[str] = set()
        self.silent: set[str] = set()
        self.queries: Counter[str] = Counter()
        self.server = DNSServer(
            self._resolver(),
            port=0,
            address="127.0.0.1",
            logger=DNSLogger("-request,-reply,-truncated,-error,-recv,-send,-data"),
        )

    @property
    def port(self) -> int:
        return int(self.server.server.server_address[1])

    @property
    def nameservers(self) -> str:
        """The DNS_NAMESERVERS value that points at this server."""
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> DnsServer:
        self.server.start_thread()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()

    def _resolver(self) -> BaseResolver:
        dns = self

        class Table(BaseResolver):  # type: ignore[misc]
            def resolve(self, request: Any, handler: Any) -> Any:
                reply = request.reply()
                name = str(request.q.qname).rstrip(".").lower()
                dns.queries[name] += 1
                if name in dns.silent:
                    time.sleep(3)  # longer than the tests' DNS_TIMEOUT_SECONDS
                    return reply
                if name in dns.failing:
                    reply.header.rcode = RCODE.SERVFAIL
                    return reply
                if request.q.qtype == QTYPE.TXT and name in dns.txt:
                    for value in dns.txt[name]:
                        data = value.encode()
                        strings = [data[i : i + 255] for i in range(0, len(data), 255)]
                        reply.add_answer(RR(request.q.qname, QTYPE.TXT, rdata=TXT(strings), ttl=0))
                    return reply
                if name not in dns.records:
                    if name not in dns.txt:
                        reply.header.rcode = RCODE.NXDOMAIN
                    return reply
                for text in dns.records[name]:
                    address = ip_address(text)
                    if address.version == 4 and request.q.qtype == QTYPE.A:
                        reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(text), ttl=0))
                    if address.version == 6 and request.q.qtype == QTYPE.AAAA:
                        reply.add_answer(
                            RR(request.q.qname, QTYPE.AAAA, rdata=AAAA(address.exploded), ttl=0)
                        )
                return reply

        return Table()
