"""What the worker tells its operators about the messages it handled: counts (`stats`,
logged when the worker stops), metrics, a warning per expired lease it swept, an error per
stale finalize, and one `transition` line per message that changed state (at INFO)."""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from mailbag import log, metrics
from mailbag.worker.database import Finalized, Written
from mailbag.worker.fleet import metric_label
from mailbag.worker.ledger import Decided


class Report:
    def __init__(self, log: Any, provider: str) -> None:
        self.log, self.provider = log, provider
        self.stats: dict[str, int] = defaultdict(int)

    def swept(self, changed: Sequence[Any]) -> None:
        metrics.LEASE_EXPIRATIONS.inc(len(changed))
        for item in changed:
            self.stats["swept"] += 1
            self.log.warning(
                "lease_expired",
                message_id=str(item.message.id),
                attempt=item.message.attempt_count,
                claimed_by=item.message.claimed_by,
                transition="processing->unknown",
            )

    def expired_again(self, count: int) -> None:
        """`count` of those swept had a lease expire before: a worker keeps dying on them."""
        metrics.LEASE_EXPIRED_AGAIN.inc(count)

    def written(self, results: Written) -> None:
        for items, result in results:
            self._finalized(items, result)

    def _finalized(self, items: Sequence[Decided], result: Finalized) -> None:
        stale = set(result.stale)
        for item in items:
            decision = item.decision
            if item.message.id in stale:
                self.stats["stale"] += 1
                metrics.STALE_FINALIZES.inc()
                # Someone else owns this row now (our lease expired and it was swept or
                # re-claimed): record what we knew, loudly, and change nothing.
                self.log.error(
                    "stale_finalize",
                    message_id=str(item.message.id),
                    attempt=item.message.attempt,
                    outcome=decision.action.value,
                    provider_message_id=decision.provider_message_id,
                    error=decision.error,
                )
                continue
            self.stats[decision.action.value] += 1
        # One inc per (outcome, provider, template) and batch, not one per message; the
        # provider is the one whose answer it was (one of a route's), else this worker's.
        by_id = {item.message.id: metric_label(item.decision.provider or "") for item in items}
        outcomes = Counter(
            (c.message.status, by_id.get(c.message.id) or self.provider, c.message.template_name)
            for c in result.changed
        )
        for (status, provider, template_name), count in outcomes.items():
            counter = metrics.OUTCOME_COUNTERS.get(status)
            if counter is not None:
                counter.labels(provider, metrics.template_label(template_name)).inc(count)
        if not log.enabled(logging.INFO):
            return
        for changed in result.changed:
            self.log.info(
                "transition",
                message_id=str(changed.message.id),
                attempt=changed.message.attempt_count,
                transition=f"{changed.from_status.value}->{changed.message.status}",
                provider_message_id=changed.message.provider_message_id,
                # A sent message's is the recipients the provider refused, if any.
                error=changed.message.last_error,
            )
