"""Notifications: telling a person that a question was asked, a task blocked or failed for good,
or a `fleet wait` batch finished.

Invariant: firing never blocks nor fails the caller. `fire` builds the event and, when any
notifier is configured, hands it to a separate delivery process (`python -m fleet.alerts`)
without waiting for it; with none configured it returns having started nothing. Under a
systemd unit the delivery process is a transient unit of its own, so it outlives the unit that
fired (fleet-reap runs as ExecStopPost, and whatever is left in the unit's cgroup is killed
when it exits); elsewhere it is a detached child in a session of its own. The delivery process
runs each notifier independently and bounded in time: the command hook (`notify_command`), the
webhook (`notify_webhook`, retried), each apprise URL (`notify_urls`, retried like the webhook),
Telegram (`telegram_chats`: spooled in the store by `fire` itself, so a message that cannot be
sent now is sent by a later delivery or by fleet-telegram; see fleet.telegram.outbox) and a
desktop notification (`notify-send`).
Every failure, whether starting the delivery or of one notifier, is logged as one line (to the
journal under journald, else on standard error) and swallowed; the delivery process always
exits 0. `undelivered` counts what waits in the spool.

The event is a JSON object: event, time, message, host, task, title, status, reason, and the
extra keys of the event (`question`, `kind`, `options`, `tasks`, `outcome`, …). Texts are
redacted (fleet.redact) and clipped to MAX_TEXT characters.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from fleet.config import Config
    from fleet.model import Task
    from fleet.paths import Paths
    from fleet.redact import Redactor

MAX_TEXT = 4000  # characters of the message and of each extra text (a question, say)
SPOOL = "alerts"  # FLEET_HOME/alerts/: one file per event, removed by its delivery process
PAUSE_FIRST, PAUSE_MAX = 0.5, 8.0  # seconds between webhook tries: 0.5, 1, 2, 4, 8, 8 …
KILL_GRACE = 2  # seconds added to the bound for killing and reaping a hook
UNIT_GRACE = 10  # RuntimeMaxSec= of the transient unit, beyond the process's own bound
# Where `python -m fleet.alerts` starts: the directory that holds the fleet package, so that
# a checkout run through bin/fleet (fleet not installed) finds it too.
PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
IDENTIFIER = "fleet-notify"


class Notifiers(NamedTuple):
    """The notifiers to run, as resolved by the process that fires (its configuration, its
    environment), so that the delivery process needs neither (the Telegram token aside,
    which it reads itself from where `telegram_token_file` says, never from here)."""

    command: str
    webhook: str
    desktop: bool
    timeout: int
    retries: int
    urls: tuple[str, ...] = ()
    telegram_chats: tuple[int, ...] = ()
    telegram_api: str = ""
    telegram_token_file: str = ""
    telegram_credential: bool = False

    @classmethod
    def from_config(cls, config: Config) -> Notifiers:
        from fleet.telegram.token import configured

        desktop = config.get_bool("notify_desktop") and desktop_available()
        telegram = configured(config)
        return cls(
            config.get_str("notify_command").strip(),
            config.get_str("notify_webhook").strip(),
            desktop,
            config.get_int("notify_timeout_seconds"),
            config.get_int("notify_retries"),
            tuple(u.strip() for u in config.values["notify_urls"] if u.strip()),
            tuple(config.values["telegram_chats"]) if telegram else (),
            config.get_str("telegram_api_url") if telegram else "",
            os.path.expanduser(config.get_str("telegram_token_file").strip()) if telegram else "",
            config.get_bool("telegram_credential") if telegram else False,
        )

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Notifiers:
        found = cls(**obj)
        return found._replace(
            urls=tuple(found.urls), telegram_chats=tuple(int(c) for c in found.telegram_chats)
        )

    @property
    def any(self) -> bool:
        return bool(self.command or self.webhook or self.desktop or self.urls or self.telegram)

    @property
    def telegram(self) -> bool:
        return bool(self.telegram_chats)

    def tried(self) -> float:
        """Seconds one retried notifier (webhook, URL, Telegram send) may take, all tries."""
        return (self.retries + 1) * self.timeout + sum(pause(i) for i in range(self.retries))

    def bound(self) -> float:
        """Seconds the whole delivery may take: the slowest notifier, all its tries counted."""
        retried = self.webhook or self.urls or self.telegram
        return max(self.timeout + KILL_GRACE, self.tried() if retried else 0.0)


def desktop_available(env: Mapping[str, str] | None = None) -> bool:
    """notify-send is on PATH and there is a session bus to reach a notification server on."""
    import shutil

    env = os.environ if env is None else env
    if shutil.which("notify-send", path=env.get("PATH")) is None:
        return False
    if env.get("DBUS_SESSION_BUS_ADDRESS"):
        return True
    runtime = env.get("XDG_RUNTIME_DIR", "")
    return bool(runtime) and os.path.exists(os.path.join(runtime, "bus"))


def pause(attempt: int) -> float:
    """The pause before webhook try number attempt + 2."""
    return min(PAUSE_FIRST * (1 << attempt), PAUSE_MAX)


def clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def make_event(
    kind: str,
    message: str,
    task: Task | None = None,
    redact: Redactor | None = None,
    /,
    **extra: object,
) -> dict[str, Any]:
    """The event object that every notifier receives (the extras may use any name, `kind`
    included, but not those of the fixed keys); `redact` by default masks token shapes."""
    from fleet.host import owner
    from fleet.redact import Redactor
    from fleet.timeutil import now_iso

    redact = redact or Redactor()

    def text(value: str | None) -> str | None:
        return None if value is None else clip(redact(value))

    obj: dict[str, Any] = {
        "event": kind,
        "time": now_iso(),
        "message": text(message),
        "host": owner(),
        "task": task.id if task else None,
        "title": text(task.title) if task else None,
        "status": str(task.status) if task else None,
        "reason": text(task.reason) if task else None,
    }
    for key, value in extra.items():
        if key not in obj:
            obj[key] = text(value) if isinstance(value, str) else value
    return obj


def fire(
    paths: Paths,
    config: Config,
    event: str,
    message: str,
    /,
    *,
    task: Task | None = None,
    **extra: object,
) -> None:
    """Notify a person of `event`, if any notifier is configured; never blocks, never raises.

    Costs a few configuration look-ups and at most a PATH search when nothing is configured;
    otherwise one small file and one short process (systemd-run under a unit, else the shell
    that detaches the delivery).
    """
    task_id = task.id if task else None
    try:
        notifiers = Notifiers.from_config(config)
        if not notifiers.any:
            return
        from fleet.redact import Redactor, configured

        # What agents wrote was redacted when it came in; this is the second net.
        redact = Redactor(configured(config.values))
        obj = make_event(event, message, task, redact, **extra)
        _start(paths, notifiers, obj, _spool(paths, notifiers, obj))
    except Exception as e:  # whatever it is, the caller must go on
        log(f'cannot start delivering the "{event}" notification: {_why(e)}', task=task_id)


def _spool(paths: Paths, notifiers: Notifiers, obj: Mapping[str, Any]) -> list[int] | None:
    """Telegram's messages, spooled in the store here and now (one short transaction): they
    are then kept whatever becomes of the delivery, and a running fleet-telegram, woken by the
    commit, may send them before the delivery process has started. None if that failed (the
    delivery process tries again)."""
    if not notifiers.telegram:
        return None
    from fleet.telegram import delivery

    try:
        return [m.id for m in delivery.spool_event(str(paths.home), obj, notifiers.telegram_chats)]
    except Exception as e:
        log(f"telegram: cannot spool the notification yet: {_why(e)}", task=obj.get("task"))
        return None


def _why(e: BaseException) -> str:
    from fleet.errors import FleetError

    if isinstance(e, FleetError):
        return e.message
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}" + (f": {e.filename}" if e.filename else "")
    return f"{type(e).__name__}: {e}"


def _start(
    paths: Paths, notifiers: Notifiers, obj: Mapping[str, Any], spooled: list[int] | None
) -> None:
    import secrets

    from fleet.fsutil import write_atomic
    from fleet.paths import ensure_dir

    payload = {
        "event": obj,
        "notifiers": notifiers._asdict(),
        "home": str(paths.home),
        "spooled": spooled,
    }
    spool = ensure_dir(paths.home / SPOOL) / f"{secrets.token_hex(8)}.json"
    write_atomic(spool, json.dumps(payload, default=str).encode(), durable=False)
    argv = [sys.executable, "-m", "fleet.alerts", str(spool)]
    try:
        if os.environ.get("INVOCATION_ID"):
            try:
                _transient(paths, notifiers, obj, argv)
                return
            except Exception as e:
                log(
                    f"cannot start a transient unit ({_why(e)}); delivering from this unit,"
                    " which may end first",
                    task=obj.get("task"),
                )
        _detach(argv)
    except BaseException:
        spool.unlink(missing_ok=True)
        raise


def _transient(
    paths: Paths, notifiers: Notifiers, obj: Mapping[str, Any], argv: Sequence[str]
) -> None:
    """Start the delivery as a transient unit, which the end of the caller's unit leaves alone."""
    import secrets

    from fleet import systemd
    from fleet.proc import run

    scope = systemd.current_scope()
    about = f"{obj['event']} {obj['task']}" if obj.get("task") else str(obj["event"])
    options = [
        f"--unit=fleet-notify-{secrets.token_hex(4)}",
        f"--description=fleet notification: {about}",
        f"--property=RuntimeMaxSec={int(notifiers.bound()) + UNIT_GRACE}",
        f"--working-directory={PACKAGE_ROOT}",
        f"--setenv=FLEET_HOME={paths.home}",
        f"--setenv=FLEET_SCOPE={scope}",
    ]
    if notifiers.telegram_credential and scope == "system":
        from fleet.telegram.token import CREDENTIAL

        options.append(f"--property=LoadCredential={CREDENTIAL}:{notifiers.telegram_token_file}")
    if notifiers.desktop and os.environ.get("DBUS_SESSION_BUS_ADDRESS"):
        options.append(
            f"--setenv=DBUS_SESSION_BUS_ADDRESS={os.environ['DBUS_SESSION_BUS_ADDRESS']}"
        )
    if scope == "system" and os.geteuid() != 0:
        # The system manager would run it as root: keep the hook to the caller's rights.
        options += [f"--uid={os.geteuid()}", f"--gid={os.getegid()}"]
    run(
        [
            "systemd-run",
            *(["--user"] if scope == "user" else []),
            "--no-block",
            "--collect",
            "--quiet",
            *options,
            "--",
            *argv,
        ],
        timeout=10,
    )


def _detach(argv: Sequence[str]) -> None:
    """Start the delivery outside any unit: a child of a short-lived shell, in its own session
    (so it is reparented at once and never left a zombie of the caller's)."""
    import subprocess

    from fleet.errors import FleetError
    from fleet.proc import child_env

    log_fd = _log_destination()
    shell = subprocess.Popen(
        ["/bin/sh", "-c", '"$@" &', "sh", *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log_fd,
        cwd=PACKAGE_ROOT,
        env=child_env(),
        start_new_session=True,
    )
    if shell.wait(timeout=10) != 0:
        raise FleetError(f"/bin/sh exited with status {shell.returncode}")


def _log_destination() -> int:
    """Our standard error for the delivery's log lines when it is a terminal, a file or the
    journal; not a pipe or other socket, whose reader would wait for the delivery to end."""
    import stat
    import subprocess

    from fleet.journal import under_journald

    try:
        mode = os.fstat(2).st_mode
    except OSError:
        return subprocess.DEVNULL
    if os.isatty(2) or stat.S_ISREG(mode) or stat.S_ISCHR(mode) or under_journald():
        return 2
    return subprocess.DEVNULL


def log(text: str, *, task: str | None = None, notifier: str | None = None) -> None:
    """One line about a notification that went wrong: a journal entry (priority warning) under
    journald, else `fleet: notify: …` on standard error. Never raises."""
    from fleet.journal import Journal, under_journald

    line = f"fleet: notify: {text}"
    if under_journald():
        fields: dict[str, str | int] = {
            "MESSAGE": line,
            "PRIORITY": 4,
            "SYSLOG_IDENTIFIER": IDENTIFIER,
        }
        if task:
            fields["FLEET_TASK_ID"] = task
        if notifier:
            fields["FLEET_NOTIFIER"] = notifier
        with contextlib.suppress(OSError):
            journal = Journal()
            try:
                journal.send(fields)
                return
            finally:
                journal.close()
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


# ---------------------------------------------------------------------- the delivery process


def deliver(
    obj: Mapping[str, Any],
    notifiers: Notifiers,
    home: str | None = None,
    spooled: Sequence[int] | None = None,
) -> None:
    """Run every configured notifier at once, each bounded; log those that fail. Telegram's
    messages are the outbox rows `spooled` (by `fire`), or else are spooled in the store of
    `home` (default: FLEET_HOME) before anything runs."""
    import threading
    import time

    body = json.dumps(obj, ensure_ascii=False, default=str).encode()
    task = obj.get("task")
    what = f'the "{obj.get("event")}" notification' + (f" for {task}" if task else "")
    jobs: list[tuple[str, Any]] = []
    bound = notifiers.bound()
    deadline = time.monotonic() + bound
    if notifiers.telegram:
        telegram = _telegram_job(obj, notifiers, home, spooled, deadline - KILL_GRACE, what)
        if telegram is not None:
            jobs.append(("telegram", telegram))
    for url in notifiers.urls:
        jobs.append((f"notify_urls ({_shown(url)})", _url_job(url, obj, notifiers)))
    if notifiers.command:
        jobs.append(
            ("notify_command", lambda: run_command(notifiers.command, obj, body, notifiers.timeout))
        )
    if notifiers.webhook:
        jobs.append(
            (
                f"notify_webhook ({_site(notifiers.webhook)})",
                lambda: post(notifiers.webhook, body, notifiers.timeout, notifiers.retries),
            )
        )
    if notifiers.desktop:
        jobs.append(("notify-send", lambda: desktop(obj, notifiers.timeout)))

    def one(name: str, job: Any) -> None:
        try:
            why = job()
        except Exception as e:
            why = _why(e)
        if why:
            log(f"{name} did not deliver {what}: {why}", task=task, notifier=name)

    threads = [threading.Thread(target=one, args=job, daemon=True) for job in jobs]
    for thread in threads:
        thread.start()
    for (name, _), thread in zip(jobs, threads, strict=True):
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            log(f"{name} did not deliver {what}: gave up after {bound:g} s", task=task)


def _url_job(url: str, obj: Mapping[str, Any], notifiers: Notifiers) -> Any:
    def job() -> str | None:
        from fleet import notify_urls

        return notify_urls.send(url, obj, notifiers.timeout, notifiers.retries)

    return job


def _shown(url: str) -> str:
    from fleet import notify_urls

    return notify_urls.shown(url)


def _telegram_job(
    obj: Mapping[str, Any],
    notifiers: Notifiers,
    home: str | None,
    spooled: Sequence[int] | None,
    deadline: float,
    what: str,
) -> Any:
    """The job that sends the event's spooled messages and whatever else is due; the event
    is spooled for every chat first if `fire` did not (None, logged, if it cannot be)."""
    from fleet.telegram import delivery

    ids = list(spooled) if spooled is not None else None
    if ids is None:
        try:
            ids = [m.id for m in delivery.spool_event(home, obj, notifiers.telegram_chats)]
        except Exception as e:
            task = obj.get("task")
            log(f"telegram cannot spool {what}: {_why(e)}", task=task, notifier="telegram")
            return None

    def job() -> str | None:
        return delivery.send(home, notifiers, ids, deadline)

    return job


def undelivered(paths: Paths) -> int:
    """How many notifications wait in the spool (Telegram messages not sent yet)."""
    from fleet.store import Actor, open_store

    store = open_store(paths, Actor("fleet", "fleet"))
    try:
        return store.spooled()
    finally:
        store.close()


def _site(url: str) -> str:
    """scheme://host[:port] of a URL: webhook paths often carry a secret token."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    except ValueError:
        return "an unreadable URL"


def _env_text(value: object) -> str:
    return "" if value is None else str(value).replace("\0", "")


def run_command(command: str, obj: Mapping[str, Any], body: bytes, timeout: int) -> str | None:
    """`/bin/sh -c COMMAND` with the event as FLEET_NOTIFY_* and JSON on stdin; None if it
    succeeded, else why not. After `timeout` seconds its whole process group is killed."""
    import signal
    import subprocess

    from fleet.proc import child_env

    extra = {
        "FLEET_NOTIFY_EVENT": _env_text(obj.get("event")),
        "FLEET_NOTIFY_TASK": _env_text(obj.get("task")),
        "FLEET_NOTIFY_TITLE": _env_text(obj.get("title")),
        "FLEET_NOTIFY_MESSAGE": _env_text(obj.get("message")),
    }
    if obj.get("question") is not None:
        extra["FLEET_NOTIFY_QUESTION"] = _env_text(obj["question"])
    if isinstance(obj.get("tasks"), list):
        extra["FLEET_NOTIFY_TASKS"] = " ".join(map(str, obj["tasks"]))
    env = {k: v for k, v in child_env().items() if not k.startswith("FLEET_NOTIFY_")}
    env.update(extra)
    out = 2 if _fd_open(2) else subprocess.DEVNULL
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command],
        stdin=subprocess.PIPE,
        stdout=out,
        stderr=out,
        env=env,
        start_new_session=True,
    )
    try:
        proc.communicate(body, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return f"still running after {timeout} s; its process group was killed"
    if proc.returncode > 0:
        return f"exited with status {proc.returncode}"
    if proc.returncode < 0:
        return f"killed by {signal.Signals(-proc.returncode).name}"
    return None


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def post(url: str, body: bytes, timeout: int, retries: int) -> str | None:
    """POST the event JSON; None once a 2xx answer came, else why not. Connection errors,
    timeouts, 429 and 5xx are tried again up to `retries` times with growing pauses; any other
    answer is final."""
    import http.client
    import time
    import urllib.error
    import urllib.request
    from urllib.parse import urlsplit

    from fleet import __version__

    if urlsplit(url).scheme not in ("http", "https"):
        return "not an http:// or https:// URL"

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        # urllib would turn a redirected POST into a GET without the event.
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": f"fleet/{__version__}"},
    )
    why, delay = "", 0.0
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(delay)
        delay = pause(attempt)
        try:
            with opener.open(request, timeout=timeout) as answer:
                answer.read(1 << 16)
            return None
        except urllib.error.HTTPError as e:
            why = f"HTTP {e.code} {e.reason}".rstrip()
            e.close()
            if e.code != 429 and e.code < 500:
                return f"{why}, not tried again"
            after = (e.headers.get("Retry-After") or "").strip()
            if after.isdigit():  # the receiver's own pause, within ours
                delay = min(max(delay, float(after)), PAUSE_MAX)
        except urllib.error.URLError as e:
            why = _reason(e.reason, timeout)
        except (OSError, http.client.HTTPException) as e:
            why = _reason(e, timeout)
    tries = retries + 1
    return f"{why} ({tries} {'try' if tries == 1 else 'tries'})"


def _reason(reason: object, timeout: int) -> str:
    if isinstance(reason, TimeoutError):
        return f"no answer within {timeout} s"
    if isinstance(reason, BaseException):
        return _why(reason)
    return str(reason)


def summary(obj: Mapping[str, Any]) -> str:
    """The one-line heading of a desktop notification, e.g. `fleet: question on fl-7k2m9q`."""
    kind, task, title = obj.get("event"), obj.get("task"), obj.get("title")
    head = f"fleet: {kind}" + (f" on {task}" if task else "")
    return head + (f": {title}" if title else "")


def desktop(obj: Mapping[str, Any], timeout: int) -> str | None:
    """notify-send with the summary and the message; None if it succeeded, else why not."""
    import subprocess

    from fleet.proc import child_env

    urgency = "critical" if obj.get("event") in ("question", "failed") else "normal"
    argv = [
        "notify-send",
        "--app-name=fleet",
        f"--urgency={urgency}",
        "--",
        summary(obj),
        str(obj.get("message") or ""),
    ]
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            env=child_env(),
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        return "notify-send is not installed or not on PATH"
    except subprocess.TimeoutExpired:
        return f"still running after {timeout} s; killed"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return f"exited with status {done.returncode}: {last}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m fleet.alerts FILE`: deliver the event in FILE (written by `fire`, removed
    here), or `-` to read it from standard input. Exits 0 whatever the notifiers did."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m fleet.alerts FILE|-\n")
        return 2
    os.chdir("/")  # started in the package's directory only to find it
    try:
        if args[0] == "-":
            data = json.loads(sys.stdin.read())
        else:
            path = Path(args[0])
            try:
                data = json.loads(path.read_text())
            finally:
                path.unlink(missing_ok=True)
        obj = data["event"]
        notifiers = Notifiers.from_json(data["notifiers"])
        home = data.get("home")
        spooled = data.get("spooled")
        ids = [int(i) for i in spooled] if isinstance(spooled, list) else None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log(f"cannot read the notification {args[0]}: {_why(e)}")
        return 0
    deliver(obj, notifiers, home if isinstance(home, str) else None, ids)
    return 0


if __name__ == "__main__":
    sys.exit(main())
