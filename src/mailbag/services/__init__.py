"""Use cases: they own transactions and call the store; no SQL text, no HTTP here."""
