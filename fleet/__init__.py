"""fleet: run many coding agents in parallel from one task queue, supervised by systemd.

Importing this package must stay cheap: every command imports it at start-up.
"""

__version__ = "0.1.0"
