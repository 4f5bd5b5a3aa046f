"""Prometheus metrics: what the alerts in deploy/prometheus-alerts.yml are written against.

Counters and histograms count in the process that does the work (API or worker); the
gauges about the whole outbox (messages by state, the oldest due message) are read from
the database when /metrics is scraped.

Tenant ids are not shown to whoever scrapes: a series that could name a tenant carries
`tenant="all"` unless METRICS_TENANT_LABELS is true (`configure`).

Several processes (`mailbag api --workers N`) share their series through prometheus_client's
multiprocess mode: with PROMETHEUS_MULTIPROC_DIR set before this module is imported, every
process writes its values to files there and a scrape of any one of them (`registry()`)
adds up the counters and histograms of all of them; each gauge says how its processes'
values combine (`multiprocess_mode`).
"""

from __future__ import annotations

import os

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, multiprocess

from mailbag.store.stats import COUNT_CAP

# Read once, as prometheus_client reads it once when its values module loads: the two agree.
MULTIPROCESS_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None

ENQUEUED = Counter("mailbag_enqueued_total", "Messages put into the outbox.", ["template"])
# What each finalize ended in, by the state it left the message in: one counter each.
OUTCOME_COUNTERS = {
    state: Counter(f"mailbag_{stem}_total", help_text, ["provider", "template"])
    for state, stem, help_text in (
        ("sent", "sent", "Messages a provider accepted."),
        ("failed", "failed", "Messages permanently rejected."),
        ("dead", "dead", "Messages whose attempt budget ran out."),
        ("unknown", "unknown", "Sends whose outcome is unknown (never resent)."),
        ("retrying", "retried", "Attempts that will be retried."),
        ("expired", "messages_expired", "Messages whose expires_at passed before they were sent."),
    )
}
SENT = OUTCOME_COUNTERS["sent"]
PROVIDER_SECONDS = Histogram(
    "mailbag_provider_call_seconds",
    "Time a provider call took.",
    ["provider"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
PROVIDER_ERRORS = Counter(
    "mailbag_provider_errors_total",
    "Provider calls that did not accept.",
    ["provider", "error_class"],
)
LEASE_EXPIRATIONS = Counter(
    "mailbag_lease_expirations_total", "Claims whose lease expired (swept to unknown)."
)
LEASE_EXPIRED_AGAIN = Counter(
    "mailbag_lease_expired_repeatedly_total",
    "Lease expirations of a message whose lease had expired before.",
)
STALE_FINALIZES = Counter(
    "mailbag_stale_finalizes_total",
    "Finalizes refused because the claim was no longer the worker's.",
)
UNCONFIRMED_CLAIMS_RELEASED = Counter(
    "mailbag_unconfirmed_claims_released_total",
    "Messages released unsent: their claim committed while the worker heard an error.",
)
IDEMPOTENT_REPLAYS = Counter(
    "mailbag_idempotent_replays_total",
    "Requests answered from a stored idempotency record.",
    ["operation"],
)
FINGERPRINT_CONFLICTS = Counter(
    "mailbag_idempotency_conflicts_total",
    "Idempotency keys reused for a different request (by tenant if METRICS_TENANT_LABELS).",
    ["tenant"],
)
RECONCILIATIONS = Counter(
    "mailbag_reconciliation_outcomes_total",
    "What reconciliation concluded about unknown messages.",
    ["outcome"],
)
PROVIDER_EVENTS = Counter(
    "mailbag_provider_events_total", "Provider events received.", ["provider", "kind"]
)
UNMATCHED_EVENTS = Counter(
    "mailbag_unmatched_provider_events_total",
    "Provider events for a message id we never recorded.",
    ["provider"],
)
CLAIM_BATCH = Histogram(
    "mailbag_claim_batch_size",
    "Messages per claim.",
    buckets=(0, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000),
)
CLAIM_SECONDS = Histogram(
    "mailbag_claim_seconds",
    "Time one claim statement took.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)
HOOK_DELIVERIES = Counter(
    "mailbag_hook_deliveries_total",
    "Event hook attempts, by what became of the delivery: delivered, retrying, dead.",
    ["outcome"],
)
HOOK_POST_SECONDS = Histogram(
    "mailbag_hook_post_seconds",
    "Time one event hook POST took (to its answer, an error or the timeout).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
HOOK_LEASE_EXPIRATIONS = Counter(
    "mailbag_hook_lease_expirations_total",
    "Event hook deliveries whose lease expired mid-attempt (retried: a receiver may see "
    "them twice, same webhook-id).",
)
HOOK_ENDPOINT_PAUSES = Counter(
    "mailbag_hook_endpoint_pauses_total",
    "Times a hook endpoint's breaker paused it after failures in a row.",
)
SIDE_TASK_FAILURES = Counter(
    "mailbag_side_task_failures_total",
    "Failures of a worker's optional parts (hooks, scheduled jobs, ...): each failed its "
    "own unit of work, and the part went on or restarted; mail was not stopped.",
    ["task"],
)
PROVIDER_RATE_IN_FORCE = Gauge(
    "mailbag_provider_rate_per_second",
    "The fleet's send rate in force as this worker last saw it: PROVIDER_RATE, or lower while "
    "a provider's throttling cools down.",
    multiprocess_mode="mostrecent",
)
SHAPED_DOMAINS = Gauge(
    "mailbag_shaped_domains",
    "Recipient domains sent to more slowly after their deferrals (DOMAIN_SHAPING), as this "
    "worker last read them (a count: domains are not labels).",
    multiprocess_mode="mostrecent",
)
DOMAIN_DEFERRALS = Counter(
    "mailbag_domain_deferrals_total",
    "Sends a recipient domain deferred (SMTP 421/451/4.7.x, a throttle naming it): each "
    "slows that domain for the fleet (DOMAIN_SHAPING).",
)
DOMAIN_SHAPED_RELEASES = Counter(
    "mailbag_domain_shaped_releases_total",
    "Claimed messages handed back unsent, with no attempt spent, to wait for their shaped "
    "recipient domain's send slot.",
)
DKIM_SIGNING_FAILED = Counter(
    "mailbag_dkim_signing_failed_total",
    "Emails sent unsigned because their From domain's DKIM key could not sign them (the "
    "key is damaged: rotate it with `mailbag domains rotate`).",
)
PROVIDER_BREAKER_OPEN = Gauge(
    "mailbag_provider_breaker_open",
    "1 while a provider's breaker is open as this worker last read the fleet's state (its "
    "mail goes to the next provider of its route, or waits), else 0.",
    ["provider"],
    multiprocess_mode="mostrecent",
)
SCHEDULER_LEADER = Gauge(
    "mailbag_scheduler_leader",
    "1 on the replica that runs the fleet's periodic jobs (it holds the scheduler lock).",
    multiprocess_mode="livemax",
)
# The outbox's gauges are read from the database at a scrape, at most once per
# METRICS_CACHE_SECONDS per process (api/scrape.py); among several processes the newest
# reading is the one reported ("mostrecent").
MESSAGES = Gauge(
    "mailbag_messages",
    "Messages in each state that is not final (pending, processing, retrying, unknown), "
    f"counted up to {COUNT_CAP} (read at scrape, cached). Final states: the *_total counters.",
    ["state"],
    multiprocess_mode="mostrecent",
)
OLDEST_DUE_AGE = Gauge(
    "mailbag_oldest_due_message_age_seconds",
    "How long the longest-waiting due message has waited (read at scrape, cached).",
    multiprocess_mode="mostrecent",
)
UNMATCHED_STORED = Gauge(
    "mailbag_unmatched_provider_events_stored",
    f"Stored provider events matched to no message, counted up to {COUNT_CAP} (read at "
    "scrape, cached).",
    multiprocess_mode="mostrecent",
)
# By scope only: a pause's target may be a tenant's id, and a series per target would live
# on (multiprocess mode) after its pause was lifted. `mailbag pauses` names the targets.
PAUSES = Gauge(
    "mailbag_pauses",
    "Operators' pauses in force, by scope: fleet, provider, tenant (read at scrape, cached).",
    ["scope"],
    multiprocess_mode="mostrecent",
)
PAUSE_AGE = Gauge(
    "mailbag_pause_age_seconds",
    "How long the oldest pause in force of each scope has lasted, 0 with none (read at "
    "scrape, cached).",
    ["scope"],
    multiprocess_mode="mostrecent",
)
SENDER_DOMAINS_NOT_READY = Gauge(
    "mailbag_sender_domains_not_ready",
    "Sender domains whose last DNS check found them not ready (read at scrape, cached); "
    "`mailbag domains list` names them.",
    multiprocess_mode="mostrecent",
)
OUTBOX_READ_AT = Gauge(
    "mailbag_outbox_gauges_read_timestamp_seconds",
    "When the outbox's gauges were last read from the database (Unix time): during a "
    "database outage they keep their last reading, and this says how old it is.",
    multiprocess_mode="max",
)


def registry() -> CollectorRegistry:
    """What a scrape reports: this process's registry, or under multiprocess mode every
    process's series from PROMETHEUS_MULTIPROC_DIR (read afresh at each collection)."""
    if MULTIPROCESS_DIR is None:
        return REGISTRY
    combined = CollectorRegistry()
    multiprocess.MultiProcessCollector(combined, MULTIPROCESS_DIR)  # type: ignore[no-untyped-call]
    return combined


ALL_TENANTS = "all"
_tenant_labels = False


def configure(*, tenant_labels: bool) -> None:
    """Whether series may name tenants (the process's settings; off by default)."""
    global _tenant_labels
    _tenant_labels = tenant_labels


def tenant_label(tenant_id: str) -> str:
    return tenant_id if _tenant_labels else ALL_TENANTS


READY_MADE = "(ready-made)"  # the template label of a message that brought its own content


def template_label(template_name: str | None) -> str:
    """The `template` label of a message's series: its template, or READY_MADE."""
    return READY_MADE if template_name is None else template_name
