"""Shared pieces of the benchmarks: scratch FLEET_HOMEs, timed runs of the installed `fleet`, and
the one output format (one line per figure, its target next to it).

Benchmarks only print; nothing here compares a time with a target to pass or fail. The
`met`/`MISSED` word after a target is for the reader. Wall times come from `time.perf_counter()`
around the whole child process, as a user's shell would see them.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class Options:
    """How big and how often: `--quick` divides the sizes by 50 and runs everything 3 times."""

    quick: bool = False

    def size(self, full: int) -> int:
        return max(1, full // 50) if self.quick else full

    def runs(self, full: int) -> int:
        return min(3, full) if self.quick else full


def fleet_exe() -> str:
    """The installed console script next to this interpreter, else the checkout's bin/ copy."""
    script = os.path.join(os.path.dirname(sys.executable), "fleet")
    if os.access(script, os.X_OK):
        return script
    return str(ROOT / "bin" / "fleet")


def fleet_env(home: Path, bytecode_cache: bool = True) -> dict[str, str]:
    """This process's environment for a fleet pointed at `home`, every FLEET_*/XDG_* dropped.

    With `bytecode_cache` (the default) compiled modules are cached in a `pycache` directory
    next to `home`, so after one warm-up run nothing is compiled, as for an installed fleet
    (pip writes the caches at install time); the checkout itself is left untouched. Without
    it, PYTHONDONTWRITEBYTECODE=1 makes every run compile whatever has no cache already
    written beside its source (fleet's own modules in an editable install).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "XDG_"))}
    env["FLEET_HOME"] = str(home)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    if bytecode_cache:
        env["PYTHONPYCACHEPREFIX"] = str(home.parent / "pycache")
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@contextmanager
def scratch_dir(name: str) -> Iterator[Path]:
    """A temporary directory, removed afterwards; never the user's real fleet state."""
    path = Path(tempfile.mkdtemp(prefix=f"fleet-bench-{name}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_cmd(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path | None = None,
    capture: bool = False,
) -> tuple[float, bytes]:
    """Run `argv` once as a fresh process: (wall seconds, its stdout if captured).

    Standard output goes to /dev/null unless captured, so the figure is the program's own cost
    rather than the cost of a reader. A non-zero exit stops the benchmark: a figure for a
    failing command would be meaningless.
    """
    start = perf_counter()
    proc = subprocess.run(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    elapsed = perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode(errors='replace')}"
        )
    return elapsed, proc.stdout if capture else b""


def run_fleet(
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: Path | None = None,
    capture: bool = False,
) -> tuple[float, bytes]:
    """Run the installed `fleet ARGS` once as a fresh process (see `run_cmd`)."""
    return run_cmd([fleet_exe(), *args], env, cwd, capture)


def time_runs(
    argv: Sequence[str],
    env: Mapping[str, str],
    runs: int,
    warmup: int = 1,
    cwd: Path | None = None,
) -> list[float]:
    """Wall seconds of `runs` runs of `argv`, after `warmup` untimed ones (which also write
    the bytecode caches, see `fleet_env`, so no timed run pays for compiling)."""
    for _ in range(warmup):
        run_cmd(argv, env, cwd)
    return [run_cmd(argv, env, cwd)[0] for _ in range(runs)]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _num(value: float) -> str:
    """Three significant figures, without a trailing `.0` on whole numbers."""
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def figure(label: str, text: str) -> None:
    """Print one figure line: `LABEL: TEXT`."""
    print(f"{label}: {text}", flush=True)


def note(text: str) -> None:
    """Print context that is not a figure (set-up times, sizes), indented to stand apart."""
    print(f"  ({text})", flush=True)


def report(
    label: str,
    samples: Sequence[float],
    unit: str,
    target: float | None = None,
    higher_is_better: bool = False,
    extra: str = "",
) -> float:
    """Print `LABEL: median V UNIT (target <= T UNIT, met) [N runs: MIN..MAX]`; return the median.

    `samples` are already in `unit`. Without a target the parenthesis says so, so every figure
    line has the same shape.
    """
    mid = median(samples)
    text = f"median {_num(mid)} {unit}"
    if target is None:
        text += " (no target)"
    else:
        op = ">=" if higher_is_better else "<="
        ok = mid >= target if higher_is_better else mid <= target
        text += f" (target {op} {_num(target)} {unit}, {'met' if ok else 'MISSED'})"
    if extra:
        text += f" {extra}"
    text += f" [{len(samples)} runs: {_num(min(samples))}..{_num(max(samples))}]"
    figure(label, text)
    return mid


def ratio(label: str, numerator: float, denominator: float, meaning: str) -> None:
    """Print `LABEL: ratio R x (MEANING)`."""
    value = numerator / denominator if denominator else float("inf")
    figure(label, f"ratio {value:.2f}x ({meaning})")


def running_task(root: Path) -> str:
    """A task in the store of FLEET_HOME, claimed as fleet-run would claim it, so that a
    fleet-ask started for it may ask; its id."""
    from fleet.model import TaskSpec
    from fleet.paths import resolve
    from fleet.store import open_store

    store = open_store(resolve())
    try:
        (task,) = store.add([TaskSpec("bench", str(root), coder="command")])
        store.claim_task(task.id, "bench", 3600, "command", None)
    finally:
        store.close()
    return task.id
