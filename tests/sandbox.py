"""A real systemd booted as PID 1 of private namespaces, for integration tests.

Invariant: a sandbox never touches the host's /tmp, units, journal or cgroups outside its own
subtree. Booting systemd next to a host naively runs the vendor start-up units against the host
(systemd-tmpfiles-setup would empty the host's /tmp, utmp and journal flush write /var/log), and
lets the host's enabled units start. So the sandbox's systemd sees:

* private PID, mount, UTS and IPC namespaces (``unshare --kill-child``: if the harness kills
  ``unshare``, the whole sandbox dies with it);
* its own cgroup ``fleet-sandbox/<name>`` in every hierarchy but cpuset, which it treats as its
  root, so two sandboxes never share a cgroup;
* private tmpfs mounts on /run, /dev, /etc/systemd, /var/lib/systemd and /var/log/journal, with
  ``DIR/units`` as /etc/systemd/system and ``DIR/user-units`` as /etc/systemd/user;
* the vendor ``*.wants`` directories and the system generators hidden, so that only journald,
  its sockets and ``dbus.socket`` start, plus whatever a test enables in ``DIR/units``;
* a boot id of its own (``Sandbox.boot_id``, read-only over /proc/sys/kernel/random/boot_id):
  the kernel's is one per boot of the VM, shared by every namespace, but each sandbox is a boot
  of the machine it stands for, and what keys on the boot (fleet's claims, ``journalctl -b``)
  must see a new one as it would after a real reboot.

Shared with the host on purpose: /tmp (tests exchange files through ``tmp_path``), /usr, /home,
the network, the rest of /proc/sys, and /sys. The in-namespace steps are in ``sandbox_boot.sh``.

Use the ``systemd`` fixture (one sandbox per test module), ``sandbox_factory`` (sandboxes with
options, or several at once), or ``with Sandbox.boot(directory) as box:``. A test module gets
the fixtures by naming them at module level::

    from tests import sandbox
    systemd = sandbox.systemd

(``from tests.sandbox import systemd`` trips ruff's F811 on every test that takes it, and
``pytest_plugins`` warns that the module, already imported, cannot be assertion-rewritten.)

If the harness is SIGKILLed before it stops a sandbox, the sandbox keeps running: its systemd
is the child of an ``unshare`` whose arguments name the directory, and its cgroups are under
``fleet-sandbox/`` in each hierarchy.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pwd
import re
import secrets
import select
import signal
import subprocess
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

BOOT_SCRIPT = Path(__file__).resolve().with_name("sandbox_boot.sh")
SYSTEMD = "/usr/lib/systemd/systemd"
CGROUP_BASE = "fleet-sandbox"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NOBODY = 65534
# Replaced inside the sandbox: a sandbox directory below one of them would be invisible there.
PRIVATE_DIRS = (
    "/run",
    "/dev",
    "/proc",
    "/sys",
    "/etc/systemd",
    "/var/lib/systemd",
    "/var/log/journal",
)


class SandboxError(RuntimeError):
    """The sandbox did not boot, or did not stop cleanly; the message says what is left."""


class CommandFailed(subprocess.CalledProcessError):
    """A command exited non-zero; unlike CalledProcessError, str() shows its output."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout: {self.stdout}\nstderr: {self.stderr}"


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Runs a short command with an explicit environment and returns its decoded output."""
    done = subprocess.run(
        list(argv),
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        env=dict(env) if env is not None else {"PATH": PATH, "LANG": "C.UTF-8"},
        timeout=timeout,
        check=False,
    )
    result = subprocess.CompletedProcess(
        done.args,
        done.returncode,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
    )
    if check and result.returncode != 0:
        raise CommandFailed(result.returncode, result.args, result.stdout, result.stderr)
    return result


def wait_for(predicate: Callable[[], bool], timeout: float = 30, what: str = "") -> None:
    """Polls predicate until it is true; raises TimeoutError naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while not predicate():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what or predicate}")
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.1)


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy but cpuset.

    A new v1 cpuset group takes no process before its cpus and mems are set, and systemd does
    not manage cpuset on v1, so the sandbox stays in the caller's cpuset group.
    """
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, target, fstype, options, *_ = line.split()
        if fstype == "cgroup2" or (fstype == "cgroup" and "cpuset" not in options.split(",")):
            found.append(Path(target))
    return found


def namespace_processes(ns_fd: int) -> list[int]:
    """PIDs (host view) of the processes in the PID namespace that ns_fd refers to."""
    ns = os.fstat(ns_fd)
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{name}/ns/pid")
        except OSError:  # gone meanwhile, or a kernel thread
            continue
        if (st.st_dev, st.st_ino) == (ns.st_dev, ns.st_ino):
            pids.append(int(name))
    return pids


def _within(path: Path, parent: str) -> bool:
    return path == Path(parent) or Path(parent) in path.parents


def _ini(section: str, settings: Sequence[str]) -> str:
    return "".join(f"{line}\n" for line in (f"[{section}]", *settings))


def _write(path: Path, text: str) -> None:
    """Write-temp-then-rename, so systemd never reads half a unit file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    temp.write_text(text)
    temp.replace(path)


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except FileNotFoundError:
        return None


_RUNNING: set[Sandbox] = set()


@atexit.register
def _stop_leftovers() -> None:
    """Safety net for a harness that exits without stopping its sandboxes."""
    for box in list(_RUNNING):
        with contextlib.suppress(Exception):
            box.stop(timeout=5)


class Sandbox:
    """One booted systemd; see the module docstring for what it shares with the host."""

    pid: int
    """Host PID of the sandbox's systemd (PID 1 inside)."""
    directory: Path
    units: Path
    """DIR/units, which the sandbox sees as /etc/systemd/system."""
    user_units: Path
    """DIR/user-units, which the sandbox sees as /etc/systemd/user."""
    cgroup: str
    """The sandbox's cgroup, relative to the root of each hierarchy."""
    boot_id: str
    """The id every process of this boot reads from /proc/sys/kernel/random/boot_id."""
    boot_state: str
    """What `systemctl is-system-running --wait` said at the end of boot."""
    boot_seconds: float
    stop_seconds: float | None

    def __init__(
        self,
        directory: Path,
        cgroup: str,
        hierarchies: list[Path],
        unshare: subprocess.Popen[bytes],
    ) -> None:
        self.directory = directory
        self.units = directory / "units"
        self.user_units = directory / "user-units"
        self.cgroup = cgroup
        self._hierarchies = hierarchies
        self._unshare = unshare
        self._pidfd: int | None = None
        self._nsfd: int | None = None
        self._stopped = False
        self.pid = 0
        self.boot_id = ""
        self.boot_state = ""
        self.boot_seconds = 0.0
        self.stop_seconds = None

    # ------------------------------------------------------------------ boot and stop

    @classmethod
    def boot(
        cls,
        directory: Path,
        *,
        manager_conf: Sequence[str] = ("DefaultTimerAccuracySec=1ms",),
        journald_conf: Sequence[str] = ("RateLimitBurst=0",),
        tmpfs: Sequence[str] = ("/usr/local/lib",),
        state: Path | None = None,
        hostname: str | None = None,
        timeout: float = 30,
    ) -> Sandbox:
        """Boots systemd with DIR/units as /etc/systemd/system and waits until it is up.

        manager_conf and journald_conf are extra `[Manager]` and `[Journal]` lines; tmpfs names
        existing directories to hide behind a private tmpfs (for example "/var/lib" keeps
        StateDirectory= off the host); the default hides /usr/local/lib, where a system-wide
        `fleet setup` installs its journal catalog. `state`, a directory, is the sandbox's
        /var/lib/systemd instead of a tmpfs, so that a second boot with the same directory and
        state sees the timer stamps of the first (a reboot). Accepts the states "running" and
        "degraded" (a unit enabled in DIR/units failed; see boot_state); anything else is a
        SandboxError. `hostname` is the sandbox's own node name (its UTS namespace, and its
        /etc/hostname), for tests where sandboxes stand for distinct hosts; by default it keeps
        the host's.
        """
        started = time.monotonic()
        if os.geteuid() != 0:
            raise SandboxError("booting a systemd sandbox needs root")
        directory = directory.resolve()
        hidden = [*PRIVATE_DIRS, *tmpfs]
        if any(_within(directory, parent) for parent in hidden):
            raise SandboxError(f"{directory} would be hidden inside the sandbox")
        for path in tmpfs:
            if not Path(path).is_absolute() or not Path(path).is_dir() or Path(path) == Path("/"):
                raise SandboxError(f"tmpfs={path!r}: not an existing absolute directory")
        if state is not None:
            state = state.resolve()
            if not state.is_dir() or any(_within(state, parent) for parent in hidden):
                raise SandboxError(f"state={state}: not a directory the sandbox can see")
        for sub in ("units", "user-units", "conf"):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        journald = _ini("Journal", ("Storage=volatile", "ReadKMsg=no", *journald_conf))
        _write(directory / "conf" / "journald.conf", journald)
        _write(directory / "conf" / "system.conf", _ini("Manager", manager_conf))
        # A new id for every boot, in the kernel's format (sandbox_boot.sh mounts it).
        boot_id = str(uuid.uuid4())
        _write(directory / "conf" / "boot_id", boot_id + "\n")
        if hostname is not None:
            if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", hostname):
                raise SandboxError(f"hostname={hostname!r}: not a host name")
            _write(directory / "conf" / "hostname", hostname + "\n")

        tag = re.sub(r"[^A-Za-z0-9_.-]", "_", directory.name)[:40]
        cgroup = f"{CGROUP_BASE}/{tag}-{os.getpid()}-{secrets.token_hex(3)}"
        hierarchies = cgroup_hierarchies()
        argv = [
            "unshare", "--fork", "--pid", "--mount", "--uts", "--ipc",
            "--propagation", "private", "--mount-proc", "--kill-child",
            "/bin/sh", str(BOOT_SCRIPT), str(directory), cgroup,
        ]  # fmt: skip
        env = {
            "PATH": PATH,
            "SANDBOX_HIERARCHIES": "\n".join(map(str, hierarchies)),
            "SANDBOX_TMPFS": "\n".join(tmpfs),
            "SANDBOX_STATE": str(state or ""),
            "SANDBOX_HOSTNAME": hostname or "",
        }
        with (directory / "console.log").open("wb") as console:
            unshare = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a Ctrl-C meant for pytest must not kill it mid-test
            )
        box = cls(directory, cgroup, hierarchies, unshare)
        box.boot_id = boot_id
        _RUNNING.add(box)
        try:
            box._await_boot(started + timeout)
        except BaseException as error:
            console_log = (directory / "console.log").read_text(errors="replace")[-4000:]
            with contextlib.suppress(Exception):
                box.stop(timeout=5)
            if isinstance(error, Exception):
                raise SandboxError(f"boot failed: {error}\nconsole.log:\n{console_log}") from error
            raise
        box.boot_seconds = time.monotonic() - started
        return box

    def _await_boot(self, deadline: float) -> None:
        unshare = self._unshare

        def alive() -> None:
            if unshare.poll() is not None:
                raise SandboxError(f"unshare exited with status {unshare.returncode}")

        def systemd_forked() -> bool:
            alive()
            try:
                children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text()
            except OSError:
                return False
            if not children.split():
                return False
            self.pid = int(children.split()[0])
            return True

        wait_for(systemd_forked, deadline - time.monotonic(), "unshare to fork")
        # Handles that stay valid even if the PID is reused: the pidfd signals and waits, the
        # namespace fd recognises the sandbox's processes after PID 1 is gone.
        self._pidfd = os.pidfd_open(self.pid)
        self._nsfd = os.open(f"/proc/{self.pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        ppid = int(Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        if ppid != unshare.pid:
            raise SandboxError(f"process {self.pid} is not the child of unshare {unshare.pid}")

        def systemd_listening() -> bool:
            alive()
            with contextlib.suppress(OSError):
                # Only once systemd runs is /proc/PID/root/run the sandbox's private /run.
                if os.readlink(f"/proc/{self.pid}/exe") == SYSTEMD:
                    return Path(f"/proc/{self.pid}/root/run/systemd/private").is_socket()
            return False

        wait_for(systemd_listening, deadline - time.monotonic(), "/run/systemd/private")
        state = self.systemctl(
            "is-system-running", "--wait", check=False, timeout=max(deadline - time.monotonic(), 1)
        )
        self.boot_state = state.stdout.strip()
        if self.boot_state not in ("running", "degraded"):
            failed = self.systemctl("list-units", "--failed", "--no-legend", check=False).stdout
            raise SandboxError(f"system state {self.boot_state!r}{state.stderr}; failed: {failed}")

    def stop(self, timeout: float = 20) -> None:
        """Powers off (SIGKILL after timeout seconds) and checks that nothing is left.

        Raises SandboxError if a process of the sandbox's PID namespace or a directory of its
        cgroup subtree survives. Calling stop() again does nothing.
        """
        if self._stopped:
            return
        self._stopped = True
        started = time.monotonic()
        problems = []
        if self._pidfd is None:  # boot failed before systemd was found
            self._unshare.kill()
        else:
            # SIGTERM would make systemd re-execute itself; SIGRTMIN+4 starts poweroff.target,
            # and in a container systemd then exits.
            if not self._signal_and_wait(signal.SIGRTMIN + 4, timeout):
                warnings.warn(
                    f"sandbox {self.pid} did not power off within {timeout:g} s; killing it",
                    stacklevel=2,
                )
                self._signal_and_wait(signal.SIGKILL, 10)
        try:
            self._unshare.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._unshare.kill()  # --kill-child: the sandbox's PID 1 gets SIGKILL too
            self._unshare.wait()
        if self._nsfd is not None:
            nsfd = self._nsfd
            with contextlib.suppress(TimeoutError):
                wait_for(lambda: not namespace_processes(nsfd), 5, "the namespace to empty")
            if left := namespace_processes(nsfd):
                problems.append(f"processes still in the sandbox's PID namespace: {left}")
        if cgroups := self._remove_cgroups(deadline=time.monotonic() + 5):
            problems.append(f"cgroups not removed: {cgroups}")
        for fd in (self._pidfd, self._nsfd):
            if fd is not None:
                os.close(fd)
        self._pidfd = self._nsfd = None
        _RUNNING.discard(self)
        self.stop_seconds = time.monotonic() - started
        if problems:
            raise SandboxError("; ".join(problems))

    def _signal_and_wait(self, signum: int, timeout: float) -> bool:
        assert self._pidfd is not None
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self._pidfd, signum)
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)  # readable once the process has exited
        return bool(poller.poll(int(timeout * 1000)))

    def _remove_cgroups(self, deadline: float) -> list[str]:
        """Removes the sandbox's cgroup subtree in every hierarchy; returns what is left."""
        while True:
            left = []
            for hierarchy in self._hierarchies:
                root = hierarchy / self.cgroup
                if not root.exists():
                    continue
                for dirpath, _, _ in os.walk(root, topdown=False):
                    with contextlib.suppress(OSError):  # busy for a moment after the last exit
                        os.rmdir(dirpath)
                if root.exists():
                    left.append(str(root))
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.02)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ inside the sandbox

    def run(
        self,
        *argv: str,
        check: bool = True,
        input: bytes | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 60,
        user: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Runs argv inside the sandbox (as `user`, else root) and returns its output.

        The environment is PATH, LANG, HOME, USER and LOGNAME plus `env`, nothing of the
        caller's. The working directory is the caller's when it exists inside, as it does for
        everything under /tmp. The process is not in any unit: its journal entries carry no
        _SYSTEMD_UNIT. On timeout, the command may keep running until the sandbox stops.
        """
        if self._stopped:
            raise SandboxError(f"sandbox {self.directory} is stopped")
        account = pwd.getpwnam(user or "root")
        environment = {
            "PATH": PATH,
            "LANG": "C.UTF-8",
            "HOME": account.pw_dir,
            "USER": account.pw_name,
            "LOGNAME": account.pw_name,
            **(env or {}),
        }
        command = ["nsenter", "-t", str(self.pid), "-m", "-p", "-u", "-i"]
        cwd = _cwd()
        if cwd is not None and Path(f"/proc/{self.pid}/root{cwd}").is_dir():
            command.append(f"--wd={cwd}")
        command.append("--")
        if user is not None:
            ids = [f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--init-groups"]
            command += ["setpriv", *ids, "--"]
        return run([*command, *argv], check=check, input=input, env=environment, timeout=timeout)

    def systemctl(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return self.run("systemctl", *args, check=check, timeout=timeout)

    def journal(self, *args: str) -> list[dict[str, Any]]:
        """journalctl -o json --all ARGS, one dict per entry (binary fields are int lists)."""
        out = self.run("journalctl", "-o", "json", "--all", "--no-pager", *args).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def write_unit(self, name: str, text: str) -> None:
        """Writes DIR/units/NAME (NAME may be "x.service.d/y.conf") and reloads systemd."""
        _write(self._unit_path(self.units, name), text)
        self.systemctl("daemon-reload")

    @staticmethod
    def _unit_path(base: Path, name: str) -> Path:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ValueError(f"unit name {name!r} must be relative, without '..'")
        return base / name

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30, what: str = "") -> None:
        """Polls predicate until it is true; raises TimeoutError naming `what` at the deadline."""
        wait_for(predicate, timeout, what)

    # ------------------------------------------------------------------ user manager

    def start_user_manager(self, uid: int = NOBODY) -> None:
        """Starts user@UID.service, so that `systemctl --user` works through run_user().

        Refuses a user whose home directory exists: the user manager may write ~/.config and
        ~/.local, and /home and /root are shared with the host. nobody (home /nonexistent) is
        safe. Two drop-ins keep logind out of the sandbox (dbus-daemon does start: the user
        manager connects to the system bus):

        * user@.service: PAMName= is empty, because the image has no pam.d/systemd-user and
          PAM's fallback "other" runs pam_systemd, which asks logind for a session;
          XDG_RUNTIME_DIR is set by hand instead.
        * user-runtime-dir@UID.service: systemd-user-runtime-dir asks logind (through a
          D-Bus-activated dbus-daemon) for the directory's size; a plain directory on the
          sandbox's private /run does.
        """
        account = pwd.getpwuid(uid)
        if os.path.lexists(account.pw_dir):
            raise SandboxError(
                f"refusing a user manager for {account.pw_name}: its home {account.pw_dir} "
                "exists on the host and the manager may write there; use nobody"
            )
        runtime = f"/run/user/{uid}"
        _write(
            self.units / f"user-runtime-dir@{uid}.service.d" / "fleet-sandbox.conf",
            "[Service]\nExecStart=\n"
            f"ExecStart=/usr/bin/install -d -m 0700 -o {uid} -g {account.pw_gid} {runtime}\n"
            f"ExecStop=\nExecStop=/bin/rm -rf {runtime}\n",
        )
        dropin = "[Service]\nPAMName=\nEnvironment=XDG_RUNTIME_DIR=/run/user/%i\n"
        self.write_unit("user@.service.d/fleet-sandbox.conf", dropin)
        self.systemctl("start", f"user@{uid}.service")
        state = self.run_user("systemctl", "--user", "is-system-running", "--wait", uid=uid)
        if state.stdout.strip() != "running":
            raise SandboxError(f"user manager of {uid}: {state.stdout.strip()} {state.stderr}")

    def run_user(
        self,
        *argv: str,
        uid: int = NOBODY,
        check: bool = True,
        input: bytes | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Runs argv as uid with XDG_RUNTIME_DIR set, as `systemctl --user` needs."""
        environment = {"XDG_RUNTIME_DIR": f"/run/user/{uid}", **(env or {})}
        name = pwd.getpwuid(uid).pw_name
        return self.run(
            *argv, check=check, input=input, env=environment, timeout=timeout, user=name
        )

    def write_user_unit(self, name: str, text: str, uid: int = NOBODY) -> None:
        """Writes DIR/user-units/NAME and reloads the user manager of uid."""
        _write(self._unit_path(self.user_units, name), text)
        self.run_user("systemctl", "--user", "daemon-reload", uid=uid)


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def systemd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """One sandbox for all tests of a module, in a fresh directory under /tmp.

    Tests share it: give units unique names, and `systemctl reset-failed` after failing one.
    """
    with Sandbox.boot(tmp_path_factory.mktemp("systemd")) as box:
        yield box


@pytest.fixture
def sandbox_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Sandbox]]:
    """Boots sandboxes with Sandbox.boot's keyword options; stops them after the test."""
    booted: list[Sandbox] = []

    def boot(**options: Any) -> Sandbox:
        box = Sandbox.boot(tmp_path_factory.mktemp("sandbox"), **options)
        booted.append(box)
        return box

    yield boot
    errors = []
    for box in booted:
        try:
            box.stop()
        except SandboxError as error:
            errors.append(str(error))
    if errors:
        raise SandboxError("; ".join(errors))
