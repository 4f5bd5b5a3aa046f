"""Peers: the same job mailbag's benchmark worker does, run on other job queues.

Each job is a message id, a recipient and a name: render mailbag's built-in `welcome`
template and hand the message to the benchmark sink. `python -m bench.peers.run` runs
procrastinate, PgQueuer and Celery at the given sizes and prints one `PeerResult` each.
"""
