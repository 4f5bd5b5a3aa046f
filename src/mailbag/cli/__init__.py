"""The `mailbag` command: parse arguments, call a service, print the answer.

The commands live in groups (outbox, maintenance, run, tenants); this table puts them in
the order `mailbag --help` lists them. invocation.py holds what they share: settings read
once, the schema policy, the exits; help.py how their help reads.

Each command imports what it needs when it runs: `mailbag --help` or `mailbag stats` must
not pay for FastAPI, uvicorn or botocore (tests/test_first_run.py keeps it so).
"""

from __future__ import annotations

from mailbag.cli import (
    bulk,
    domains,
    hooks,
    invocation,
    maintenance,
    outbox,
    pauses,
    providers,
    run,
    templates,
    tenants,
)
from mailbag.cli.help import Command, group

app = group(  # plain click help (no rich): formatting it with rich costs ~0.1 s a start
    "Transactional email through an outbox: enqueue in your transaction, sent exactly once.",
    name="mailbag",
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.callback()(invocation.begin)

COMMANDS = (
    maintenance.migrate,
    outbox.enqueue,
    bulk.send_bulk,
    outbox.stats,
    outbox.top,
    outbox.requeue,
    outbox.cancel,
    outbox.resolve,
    outbox.reconcile,
    providers.providers,
    pauses.pause,
    pauses.resume,
    pauses.pauses,
    maintenance.purge,
    maintenance.erase,
    run.worker,
    run.serve,
    run.api,
)
for command in COMMANDS:
    app.command(cls=Command)(command)
app.add_typer(outbox.suppressions, name="suppressions")
app.add_typer(tenants.tenants, name="tenants")
app.add_typer(hooks.hooks, name="hooks")
app.add_typer(domains.domains, name="domains")
app.add_typer(templates.templates, name="templates")
