"""Fair queues (issue 25): a claim shares its batch among tenants with due mail, and puts
transactional mail ahead of bulk mail without starving it; each lane in claim order."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from sqlalchemy import select

from mailbag.domain.content import BULK_WEIGHT, TRANSACTIONAL_WEIGHT
from mailbag.store.schema import outbox_messages

from helpers import T0, claim, enqueue, race_claims


def test_one_message_of_another_tenant_is_in_the_next_claim_despite_a_backlog(db):
    enqueue(db, 300, now=T0)  # tenant "default": older than B's, all of it due
    [b] = enqueue(db, 1, now=T0 + timedelta(seconds=1), tenant_id="tenant-b")
    taken = claim(db, now=T0 + timedelta(seconds=2), limit=10).messages
    assert b.id in {m.id for m in taken}
    # A's share is half the batch; MariaDB fills the rest from its window of A's head.
    assert 5 <= Counter(m.tenant_id for m in taken)["default"] <= 9


def test_tenants_with_backlogs_share_a_claim_equally(db):
    for tenant in ("t-a", "t-b", "t-c"):
        enqueue(db, 50, now=T0, tenant_id=tenant)
    taken = claim(db, now=T0, limit=30).messages
    assert Counter(m.tenant_id for m in taken) == {"t-a": 10, "t-b": 10, "t-c": 10}


def test_the_shares_fill_the_batch_when_they_do_not_divide_it(db):
    for tenant in ("t-a", "t-b", "t-c"):
        enqueue(db, 50, now=T0, tenant_id=tenant)
    assert len(claim(db, now=T0, limit=10).messages) == 10


def test_transactional_mail_goes_ahead_of_bulk_mail_without_starving_it(db):
    enqueue(db, 100, now=T0, bulk=True)  # older, and bulk
    enqueue(db, 100, now=T0 + timedelta(seconds=1))
    taken = claim(db, now=T0 + timedelta(seconds=2), limit=50).messages
    per_weight = 50 // (TRANSACTIONAL_WEIGHT + BULK_WEIGHT)
    assert Counter(m.bulk for m in taken) == {
        False: TRANSACTIONAL_WEIGHT * per_weight,
        True: BULK_WEIGHT * per_weight,
    }
    # The worker starts the transactional ones first.
    assert [m.bulk for m in taken] == sorted(m.bulk for m in taken)


def test_a_lane_is_claimed_in_claim_order(db):
    low = enqueue(db, 3, now=T0, priority="low")
    normal = enqueue(db, 3, now=T0)
    high = enqueue(db, 3, now=T0 + timedelta(minutes=1), priority="high")
    enqueue(db, 20, now=T0, tenant_id="tenant-b")
    taken = [m.id for m in claim(db, now=T0 + timedelta(minutes=2), limit=12).messages]
    ours = [i for i in taken if i in {m.id for m in low + normal + high}]
    assert ours == [m.id for m in high + normal]


def test_a_lane_with_nothing_due_yet_takes_no_share(db):
    enqueue(db, 20, now=T0)
    enqueue(db, 5, now=T0, tenant_id="tenant-b", send_at=T0 + timedelta(hours=1))
    taken = claim(db, now=T0, limit=10).messages
    assert Counter(m.tenant_id for m in taken) == {"default": 10}


def test_paused_tenants_take_no_share(db):
    from mailbag.store import dispatch
    from mailbag.store.plan import run

    from helpers import LEASE

    enqueue(db, 20, now=T0)
    enqueue(db, 20, now=T0, tenant_id="tenant-b")
    with db.engine.begin() as conn:
        taken = run(
            conn,
            dispatch.claim(
                worker_id="w1",
                now=T0,
                lease=LEASE,
                limit=10,
                paused_tenants=frozenset({"default"}),
            ),
        ).messages
    assert Counter(m.tenant_id for m in taken) == {"tenant-b": 10}


def test_claimers_racing_over_several_lanes_take_each_message_once(db):
    for tenant in ("t-a", "t-b"):
        enqueue(db, 120, now=T0, tenant_id=tenant)
    enqueue(db, 60, now=T0, tenant_id="t-a", bulk=True)
    taken = race_claims(db, claimers=4, limit=25)
    every = [i for ids in taken for i in ids]
    assert len(every) == len(set(every)) == 300
    with db.engine.connect() as conn:
        statuses = set(conn.execute(select(outbox_messages.c.status)).scalars())
    assert statuses == {"processing"}
