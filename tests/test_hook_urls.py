"""Where an event hook may be sent (domain/hooks/urls.py): the URLs an attacker or a
careless operator registers, each refused with a reason, and the proof that whatever the
rule accepts, the sender can send to."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mailbag.domain.hooks import InvalidHook, check_endpoint
from mailbag.domain.hooks.urls import Policy, UnsafeUrl, address_problem, check

PUBLIC = Policy()
DEVELOPMENT = Policy(allow_loopback=True)
INTERNAL = Policy(allow_private=True)

# Every URL of the finding that `hooks add` accepted and that then stopped the worker (httpx
# refused it at send time), or that reached an internal address.
REFUSED = {
    # httpx's parser refuses them: refused at registration, never at send time.
    "https://0177.0.0.1:9/hook": "not a valid URL",
    "https://256.1.1.1/": "not a valid URL",
    "https://1.2.3.04/": "not a valid URL",
    "https://☃.example/": "not a valid URL",
    "https://ｅｘａｍｐｌｅ.com/": "not a valid URL",  # full-width letters
    "https://xn--a.example/": "not a valid URL",  # punycode that does not decode
    # Internal destinations.
    "https://127.0.0.1": "loopback",
    "https://127.0.0.2/": "loopback",
    "https://[::1]/": "loopback",
    "https://localhost/": "localhost",
    "https://LocalHost./": "localhost",
    "https://api.localhost/": "localhost",
    "https://2130706433/": "four decimal numbers",  # 127.0.0.1 to getaddrinfo
    "https://0x7f.1/": "four decimal numbers",
    "https://127.1/": "four decimal numbers",
    "https://[::ffff:127.0.0.1]/": "loopback address (as IPv6)",
    "https://[::ffff:10.0.0.1]/": "private-network address (as IPv6)",
    "https://[64:ff9b::7f00:1]/": "loopback address (as IPv6)",  # NAT64
    "https://[2002:a9fe:a9fe::]/": "metadata address (as IPv6)",  # 6to4 of 169.254.169.254
    "https://0.0.0.0/": "unspecified",
    "https://[::]/": "unspecified",
    "https://169.254.169.254/latest/meta-data/": "cloud metadata",
    "https://[fd00:ec2::254]/": "cloud metadata",
    "https://metadata.google.internal/computeMetadata/v1/": "cloud metadata",
    "https://10.0.0.1/": "private-network",
    "https://172.16.5.4/": "private-network",
    "https://192.168.1.1/": "private-network",
    "https://100.64.0.1/": "private-network",  # shared address space (carrier NAT)
    "https://[fc00::1]/": "private-network",
    "https://169.254.1.1/": "link-local",
    "https://[fe80::1]/": "link-local",
    "https://224.0.0.1/": "multicast",
    "https://240.0.0.1/": "reserved",
    "https://192.0.2.1/": "reserved",  # documentation (TEST-NET-1)
    "https://intranet/": "full DNS name",
    "https://printer.local/": "not a public name",
    "https://hooks.corp.internal/": "not a public name",
    "https://hooks.test/": "not a public name",
    # The rest of the URL.
    "http://hooks.example.com/": "https://",
    "https://user:pw@hooks.example.com/": "credentials",
    "https://hooks.example.com/#frag": "fragment",
    "https://hooks.example.com:0/": "port",
    "https://hooks.example.com:99999/": "port",
    "ftp://hooks.example.com/": "https:// URL",
    "https:///no-host": "https:// URL",
    "https://hooks.example.com/a b": "spaces",
    "https://hooks.example.com/\x7f": "control",
    "": "1 to",
}


@pytest.mark.parametrize("url", REFUSED, ids=lambda url: url or "empty")
def test_every_url_of_the_finding_is_refused_with_its_reason(url):
    with pytest.raises(UnsafeUrl, match=REFUSED[url].replace("(", r"\(").replace(")", r"\)")):
        check(url, PUBLIC)


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/mailbag?x=1",
        "https://8.8.8.8/",
        "https://[2001:4860:4860::8888]:8443/h",
        "https://münchen.de/hooks",  # IDNA: sent as xn--mnchen-3ya.de
        "https://Hooks.Example.COM./x",
    ],
)
def test_public_receivers_are_accepted(url):
    destination = check(url, PUBLIC)
    assert destination.host == destination.host.lower()


def test_the_development_flag_opens_this_machine_only_and_the_private_flag_the_network():
    for url in (
        "https://127.0.0.1/",
        "http://localhost:8080/h",
        "http://[::1]/",
        "http://127.0.0.2/",
    ):
        check(url, DEVELOPMENT)
    for url in ("https://10.0.0.1/", "http://hooks.example.com/", "https://169.254.169.254/"):
        with pytest.raises(UnsafeUrl):
            check(url, DEVELOPMENT)
    for url in ("https://10.1.2.3/", "https://[fd12::1]/", "https://hooks.svc.cluster.local/"):
        check(url, INTERNAL)
    # Never, whatever is allowed: metadata, link-local, and http:// beyond this machine.
    both = Policy(allow_loopback=True, allow_private=True)
    for url in (
        "https://169.254.169.254/",
        "https://[fd00:ec2::254]/",
        "https://metadata.google.internal/",
        "https://169.254.10.10/",
        "http://10.0.0.1/",
        "https://2130706433/",
    ):
        with pytest.raises(UnsafeUrl):
            check(url, both)


def test_every_address_form_of_an_internal_address_is_one():
    from ipaddress import ip_address

    for text in (
        "127.0.0.1",
        "::ffff:127.0.0.1",
        "::127.0.0.1",
        "64:ff9b::7f00:1",
        "2002:7f00:1::",
    ):
        assert "loopback" in (address_problem(ip_address(text), PUBLIC) or ""), text
    assert address_problem(ip_address("::ffff:8.8.8.8"), PUBLIC) is None  # mapped public


def test_an_endpoint_with_several_bad_fields_is_refused_naming_each():
    with pytest.raises(InvalidHook) as refused:
        check_endpoint(
            url="https://127.0.0.1/",
            events=["sent", "nonsense"],
            description="x" * 501,
            policy=PUBLIC,
        )
    assert set(refused.value.errors) == {"url", "events", "description"}


# Hosts and URLs an attacker would try, built from the pieces the parsers disagree on.
LABEL = st.sampled_from(
    ["a", "xn--a", "xn--mnchen-3ya", "0x7f", "0177", "1", "256", "☃", "ｅ", "é", "-a", "a_b", "A"]
)
HOST = st.one_of(
    st.lists(LABEL, min_size=1, max_size=4).map(".".join),
    st.ip_addresses().map(lambda a: f"[{a}]" if a.version == 6 else str(a)),
    st.text(alphabet="0123456789.xXabcdef:[]%", min_size=1, max_size=20),
)
URL = st.tuples(
    st.sampled_from(["https://", "http://", "HTTPS://", "https:/"]),
    HOST,
    st.sampled_from(["", ":443", ":0", ":65536", ":08"]),
    st.sampled_from(["/", "/h?x=1", "", "/é", "/%zz"]),
).map("".join)


@settings(max_examples=400, deadline=None)
@given(URL, st.sampled_from([PUBLIC, DEVELOPMENT, INTERNAL]))
def test_whatever_the_rule_accepts_the_sender_can_send_to(url, policy):
    try:
        destination = check(url, policy)
    except UnsafeUrl:
        return
    # What the deliverer does with an accepted URL must not raise (the finding: it did).
    request = httpx.Client().build_request("POST", url, content=b"{}")
    assert request.url.host  # decodes, as httpx does when it sends
    assert destination.url.raw_host.decode("ascii").lower().rstrip(".") == destination.host
