"""The `command` coder: runs the task's description as a shell command (batch jobs).

`fleet add "nightly report" --coder command -d 'make report'` runs `/bin/sh -c 'make report'`
in the task's directory. Each output line is an `output` event; exit status 0 closes the task.
`[coders.command] binary` and `args` replace `/bin/sh` and `-c`.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.coders.base import Coder, Event, Kind, RunSpec


class CommandCoder(Coder):
    name = "command"
    default_binary = "/bin/sh"
    closes_on_success = True

    def argv(self, run: RunSpec) -> list[str]:
        args = list(self.settings.args) if self.settings.args else ["-c"]
        return [self.binary, *args, run.description or run.title]

    def parse(self, line: str) -> Sequence[Event]:
        return (Event(Kind.OUTPUT, line),)
