"""The man pages and shell completions: generated from the code, committed, and never stale.

These tests hold fleet.docs to its invariant: the committed files are exactly what the code
renders, every command and option is documented, every page is clean troff, and the completion
scripts really complete commands and task ids in a real shell.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from fleet import docs
from fleet.cli import cli
from fleet.cli.app import MODULES
from fleet.commands import PROGRAMS
from fleet.errors import EXIT_CODES
from fleet.model import ATTEMPT_FIELDS, TASK_FIELDS
from fleet.settings import BUILTIN_CODERS, CODER_SETTINGS, SETTINGS
from tests.conftest import ROOT, run_fleet

RENDERED = docs.render_all()
MAN_PAGES = sorted(p for p in RENDERED if p.startswith("man/"))
CONTEXTS = {ctx.command_path: ctx for ctx in docs.all_contexts()}
REGENERATE = f"run `{docs.REGENERATE}` and commit man/ and completions/"


def tool(name: str, package: str) -> str:
    """A program the docs tests need; missing, it fails the test and names the package."""
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: apt-get install {package}")
    return found


def shell_env() -> dict[str, str]:
    """The test's environment (its FLEET_HOME) with the installed `fleet` first on PATH."""
    bindir = os.path.dirname(sys.executable)
    return {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}


# -- the committed files are what the code renders ----------------------------------------------


def test_committed_files_match_the_code() -> None:
    differ = [
        rel
        for rel, text in RENDERED.items()
        if not (ROOT / rel).is_file() or (ROOT / rel).read_text(encoding="utf-8") != text
    ]
    present = {
        p.relative_to(ROOT).as_posix()
        for d in docs.GENERATED_DIRS
        if (ROOT / d).is_dir()
        for p in (ROOT / d).iterdir()
    }
    extra = sorted(present - set(RENDERED))
    assert not differ, f"out of date or missing: {', '.join(differ)}; {REGENERATE}"
    assert not extra, f"stale files nothing generates: {', '.join(extra)}; {REGENERATE}"


def test_the_command_table_names_where_each_command_is() -> None:
    import importlib
    import pkgutil

    import fleet.cli

    for module in pkgutil.iter_modules(fleet.cli.__path__):
        importlib.import_module(f"fleet.cli.{module.name}")
    registered = {name: c.callback.__module__ for name, c in cli.commands.items() if c.callback}
    assert registered == {name: f"fleet.cli.{m}" for name, m in MODULES.items()}


def test_every_command_has_a_page() -> None:
    expected = {"man/fleet.1", "man/fleet.toml.5"}
    commands = cli.load_all().commands
    expected |= {f"man/fleet-{name}.1" for name, c in commands.items() if not c.hidden}
    expected |= {f"man/{name}.1" for name in PROGRAMS}
    assert set(MAN_PAGES) == expected
    assert {p for p in RENDERED if p.startswith("completions/")} == set(docs.COMPLETIONS)


def test_check_and_write_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert docs.main(["--check", "--root", str(tmp_path)]) == 1
    assert "man/fleet.1: missing" in capsys.readouterr().err
    assert docs.main(["--root", str(tmp_path)]) == 0
    assert docs.main(["--check", "--root", str(tmp_path)]) == 0
    (tmp_path / "man" / "fleet-gone.1").write_text(".TH GONE 1\n")
    (tmp_path / "completions" / "fleet.fish").write_text("# edited by hand\n")
    capsys.readouterr()
    assert docs.main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "man/fleet-gone.1: stale" in err
    assert "completions/fleet.fish: differs" in err
    assert docs.REGENERATE in err
    assert docs.main(["--root", str(tmp_path)]) == 0
    assert not (tmp_path / "man" / "fleet-gone.1").exists()
    assert docs.main(["--check", "--root", str(tmp_path)]) == 0


def test_output_does_not_depend_on_the_environment(tmp_path: Path) -> None:
    """No date, no terminal width, no paths of the machine that rendered the files."""
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "FLEET_SCOPE": "system",
        "COLUMNS": "20",
        "LC_ALL": "C",
        "SOURCE_DATE_EPOCH": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "fleet.docs", "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert str(ROOT) not in "".join(RENDERED.values())


# -- every command and option is documented -----------------------------------------------------


@pytest.mark.parametrize("path", list(CONTEXTS))
def test_every_command_has_help(path: str) -> None:
    assert (CONTEXTS[path].command.help or "").strip(), f"`{path}` has no help text"


OPTIONS = [
    pytest.param(path, flag, id=f"{path} {flag}")
    for path, ctx in CONTEXTS.items()
    for opt in docs.options(ctx)
    if opt is not ctx.command.get_help_option(ctx)
    for flag in [max(opt.opts, key=len)]
]


@pytest.mark.parametrize(("path", "flag"), OPTIONS)
def test_every_option_has_help(path: str, flag: str) -> None:
    ctx = CONTEXTS[path]
    opt = next(o for o in docs.options(ctx) if flag in o.opts)
    assert (opt.help or "").strip(), f"`{path} {flag}` has no help text"


# -- the pages are clean troff and say what a reader needs --------------------------------------


@pytest.mark.parametrize("rel", MAN_PAGES)
def test_man_page_is_valid_troff(rel: str, tmp_path: Path) -> None:
    groff = tool("groff", "groff-base")
    source = tmp_path / Path(rel).name
    source.write_text(RENDERED[rel], encoding="utf-8")
    proc = subprocess.run(
        [groff, "-man", "-Tutf8", "-ww", "-z", str(source)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    for number, row in enumerate(RENDERED[rel].splitlines(), 1):
        if row.startswith('.\\"'):
            continue  # a comment
        assert not row.startswith("'"), f"{rel}:{number}: a line starting with ' is a request"
        assert not re.search(r"(?<!\\)-", row), f"{rel}:{number}: unescaped hyphen: {row}"
        assert row.isascii(), f"{rel}:{number}: raw non-ASCII: {row}"
        assert row.strip(), f"{rel}:{number}: blank line"


def formatted(rel: str) -> str:
    """The page as a reader sees it: plain text, lines long enough never to wrap a flag."""
    groff = tool("groff", "groff-base")
    proc = subprocess.run(
        [groff, "-man", "-Tutf8", "-rLL=300n", "-P-c", "-P-b", "-P-o", "-P-u"],
        input=RENDERED[rel],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return proc.stdout.replace("\u2212", "-").replace("\u2010", "-")


def page_of(path: str) -> str:
    """The man page that documents a command path (a group's page covers its subcommands)."""
    words = path.split()
    name = words[0] if len(words) == 1 else f"{words[0]}-{words[1]}"
    return f"man/{name}.1"


@pytest.mark.parametrize("path", list(CONTEXTS))
def test_page_mentions_every_flag(path: str) -> None:
    ctx = CONTEXTS[path]
    text = formatted(page_of(path))
    assert path in text
    for opt in docs.options(ctx):
        for flag in [*opt.opts, *opt.secondary_opts]:
            found = re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)
            assert found, f"{page_of(path)} does not mention {flag} of `{path}`"
    if isinstance(ctx.command, click.Group):
        for name in ctx.command.commands:
            assert f"{path} {name}" in text


def test_fleet_page_covers_the_tables() -> None:
    text = formatted("man/fleet.1")
    for code, meaning in EXIT_CODES:
        assert re.search(rf"^\s+{code}\s+{re.escape(meaning)}", text, re.M), code
    for var in ("FLEET_HOME", "FLEET_SCOPE", "FLEET_DEBUG", "XDG_STATE_HOME", "XDG_CONFIG_HOME"):
        assert re.search(rf"^\s+{var}$", text, re.M), var
    for s in SETTINGS:
        assert re.search(rf"^\s+{s.env_var}$", text, re.M), s.env_var
    for f in (*TASK_FIELDS, *ATTEMPT_FIELDS):
        assert re.search(rf"^\s+{f.name} \(", text, re.M), f.name
        assert " ".join(f.doc.replace("`", "").split()) in " ".join(text.split()), f.name
    for path in ("fleet.db", "tasks/", "config.toml", "/var/lib/fleet", "/etc/fleet/config.toml"):
        assert path in text
    assert "config.last-good.toml" in text
    assert "attempt_log" in text


def test_toml_page_covers_every_key() -> None:
    text = " ".join(formatted("man/fleet.toml.5").split())
    for s in (*SETTINGS, *CODER_SETTINGS):
        assert f"{s.name} = " in text, s.name
        assert s.help in text, s.name
    for s in SETTINGS:
        assert s.env_var in text
        if s.minimum is not None:
            assert f"From {s.minimum} to {s.maximum}." in text
    for coder in BUILTIN_CODERS:
        assert coder in text
    assert "default < file < FLEET_* environment < fleet --set" in text
    assert "config.last-good.toml" in text


def test_escaping() -> None:
    assert docs.esc(r"a\b") == r"a\eb"
    assert docs.esc("--all") == r"\-\-all"
    assert docs.esc('it\'s "x" `y`') == r"it\(aqs \(dqx\(dq \(gay\(ga"
    assert docs.esc("a…b") == r"a\[u2026]b"
    assert docs.line(".TH") == r"\&.TH"
    assert docs.line("'x") == r"\&'x"
    assert docs.prose("run `fleet ls`\n  now") == r"run \fBfleet ls\fR now"


# -- the completion scripts work in real shells -------------------------------------------------


def bash_complete(*words: str) -> list[str]:
    """COMPREPLY after sourcing completions/fleet.bash and calling its function for `words`."""
    bash = tool("bash", "bash")
    script = (ROOT / "completions" / "fleet.bash").read_text()
    found = re.search(r"^\s*complete\b.*\s-F\s+(\S+)\s+fleet\s*$", script, re.M)
    assert found, "completions/fleet.bash registers no completion function for fleet"
    array = " ".join(shlex.quote(w) for w in words)
    program = (
        f"source {shlex.quote(str(ROOT / 'completions' / 'fleet.bash'))}\n"
        f"COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; COMPREPLY=()\n"
        f"{found.group(1)} fleet\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    proc = subprocess.run(
        [bash, "--norc", "--noprofile", "-c", program],
        env=shell_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [w for w in proc.stdout.splitlines() if w]


def test_bash_completes_commands() -> None:
    assert bash_complete("fleet", "sh") == ["show"]
    assert "--priority" in bash_complete("fleet", "add", "--")


@pytest.fixture
def task_id(tmp_path: Path) -> str:
    result = run_fleet("add", "x", "--cwd", str(tmp_path))
    assert result.code == 0, result.err
    return result.out.strip()


@pytest.mark.parametrize(
    "typed",
    [
        "fl-",
        "",
        "id[:4]",
        "id[3:5]",
    ],
)
def test_bash_completes_task_ids(task_id: str, typed: str) -> None:
    word = {"id[:4]": task_id[:4], "id[3:5]": task_id[3:5]}.get(typed, typed)
    assert task_id in bash_complete("fleet", "show", word)


def test_bash_script_parses() -> None:
    bash = tool("bash", "bash")
    proc = subprocess.run(
        [bash, "-n", str(ROOT / "completions" / "fleet.bash")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("shell", "rel"), [("zsh", "completions/_fleet"), ("fish", "completions/fleet.fish")]
)
def test_other_shell_scripts_parse(shell: str, rel: str) -> None:
    exe = tool(shell, shell)
    proc = subprocess.run(
        [exe, "-n", str(ROOT / rel)], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0 and not proc.stderr, proc.stderr


def test_zsh_script_is_an_autoload_file() -> None:
    assert RENDERED["completions/_fleet"].startswith("#compdef fleet\n")


def test_fish_completes_commands_and_ids(task_id: str) -> None:
    fish = tool("fish", "fish")
    source = shlex.quote(str(ROOT / "completions" / "fleet.fish"))
    proc = subprocess.run(
        [
            fish,
            "--no-config",
            "-c",
            f"source {source}; complete -C'fleet sh'; complete -C'fleet show '",
        ],
        env=shell_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    offered = [row.split("\t")[0] for row in proc.stdout.splitlines()]
    assert "show" in offered
    assert task_id in offered
