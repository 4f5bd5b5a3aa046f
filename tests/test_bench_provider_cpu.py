"""The provider CPU benchmark runs at a tiny size and counts what it says it counts, and the
shortcuts it led to in the JSON providers write what the general code writes.

The benchmark's stand-ins (bench/brevo_fake.py, bench/provider_cpu.py's own) record each
email they took, so a provider that lost, repeated or refused one fails the run here.
"""

from __future__ import annotations

import uuid
from email.headerregistry import Address as HeaderAddress

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import provider_cpu
from mailbag.providers import http_api, postmark
from mailbag.providers.kit import ascii_envelope_address


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_benchmark_sends_every_email_once_through_each_provider_and_way() -> None:
    result = provider_cpu.run(n=20, rounds=1)
    rows = {(row["mode"], row["provider"]): row for row in result["rows"]}
    assert set(rows) == {(m, p) for m in provider_cpu.MODES for p in provider_cpu.PROVIDERS}
    for row in rows.values():
        assert (row["duplicates"], row["missing"], row["unexpected"]) == (0, 0, 0), row
        assert row["cpu_us_per_message"] > 0
    # Batches where the ESP has a call for them: one call for all 20, else 20 calls.
    calls = {name: rows["batch", name]["calls"] for name in provider_cpu.PROVIDERS}
    assert calls == {"brevo": 1, "postmark": 1, "resend": 1, "sendgrid": 20, "mailgun": 20}
    assert {rows["one_by_one", name]["calls"] for name in provider_cpu.PROVIDERS} == {20}
    assert {rows[mode, "brevo"]["ratio_to_brevo"] for mode in provider_cpu.MODES} == {1.0}
    summary = result["summary"]["batch"]["postmark"]
    assert summary["range_us"][0] <= summary["median_us"] <= summary["range_us"][1]


def test_each_round_puts_the_providers_in_another_order() -> None:
    firsts = [provider_cpu.order(n)[0][1] for n in range(len(provider_cpu.PROVIDERS))]
    assert sorted(firsts) == sorted(provider_cpu.PROVIDERS)
    for number in range(5):
        segments = provider_cpu.order(number)
        assert sorted(segments) == sorted(
            (mode, name) for mode in provider_cpu.MODES for name in provider_cpu.PROVIDERS
        )


# --- the shortcuts write what the general code writes -------------------------------------

parts = st.text(alphabet="abcXYZ019_!#$%&'*+-/=?^`{|}~.@\" ()<>,;:[]\\é", min_size=1, max_size=8)


@given(parts, parts, st.text(max_size=10))
def test_a_mailbox_is_written_as_header_address_writes_it(
    local: str, domain: str, name: str
) -> None:
    address = f"{local}@{domain}"
    try:
        ascii_form = ascii_envelope_address("postmark", address)
    except ValueError:
        return  # refused before either way is taken
    try:
        expected = str(HeaderAddress(display_name=name, addr_spec=ascii_form)) if name else None
    except Exception as exc:  # the general path refuses it: so must the shortcut
        with pytest.raises(type(exc)):
            http_api.mailbox("postmark", address, name)
        return
    assert http_api.mailbox("postmark", address, name) == (expected or ascii_form)


async def test_a_postmark_batch_body_is_its_payloads_list_as_encode_json_writes_it() -> None:
    emails = provider_cpu.outgoing(3)
    bodies: list[bytes] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        results = [{"MessageID": str(uuid.uuid4()), "ErrorCode": 0} for _ in range(3)]
        return httpx.Response(200, json=results)

    provider = postmark.PostmarkProvider(api_key="key", base_url="https://postmark.test")
    await provider._client.aclose()
    provider._client = httpx.AsyncClient(
        base_url=provider.base_url, transport=httpx.MockTransport(answer)
    )
    try:
        await provider.send_batch(emails)
    finally:
        await provider.aclose()
    payloads = [postmark.message_payload(email, "outbound") for email in emails]
    assert bodies == [orjson.dumps(payloads)]


@given(st.lists(st.text(max_size=40), max_size=30), st.integers(1, 6))
def test_postmark_cuts_its_calls_as_if_each_payload_were_written_alone(
    texts: list[str], most: int
) -> None:
    built = [(index, {"TextBody": text}) for index, text in enumerate(texts)]
    alone = [(i, orjson.dumps(payload)) for i, payload in built]
    whole = len(orjson.dumps([payload for _, payload in built]))
    for most_bytes in range(2, whole + 3):  # every size limit a cut could fall on
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(postmark, "MAX_BATCH", most)
            patch.setattr(postmark, "MAX_BATCH_BYTES", most_bytes)
            calls = list(postmark._calls(built))
            assert calls == list(postmark._sized_calls(alone))
        for indexes, body in calls:
            payloads = [built[i][1] for i in indexes]
            assert body == orjson.dumps(payloads[0] if len(payloads) == 1 else payloads)
