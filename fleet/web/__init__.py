"""fleet's web dashboard: `fleet web` (or fleet-web.service, socket-activated) serving the
queue to a browser, live.

Invariants:
- nothing here is imported by any other command: Starlette, uvicorn and Jinja load only
  when `fleet web` serves (tests/bench startup checks `fleet --help` and `fleet ls`);
- it reads what the command line reads (fleet.status, fleet.stats, the store, the journal)
  and acts through the command line's own functions (fleet.web.app.acting), so a rule holds
  whoever acts, and the audit trail says `web:<user>`;
- it never polls: pages are pushed changes over server-sent events, woken by inotify
  (fleet.web.hub) and `journalctl --follow` (fleet.web.transcript);
- whatever an agent wrote is shown, never run: escaped, its colours as classes, its links
  inert (fleet.web.text), under a Content-Security-Policy that allows no inline script;
- only a browser that opened the login link of `fleet web url` gets in (fleet.web.access,
  fleet.web.guard).
"""
