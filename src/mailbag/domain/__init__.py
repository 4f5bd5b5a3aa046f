"""The pure core: states, transitions, retry policy and validation. No I/O happens here.

Each module is one concept (message, content, states, delivery, policy, rate, hooks ...);
import from the module itself. The package's own names for applications are mailbag's
(`mailbag.new_message`, `mailbag.Attachment` ...).
"""
