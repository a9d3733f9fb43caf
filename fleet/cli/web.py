"""`fleet web`: the dashboard in the foreground, and `fleet web url`, the link that logs a
browser in. Starlette, uvicorn and Jinja are imported here only, when the server starts."""

from __future__ import annotations

import sys

import click

from fleet.cli.app import App, cli, pass_app


@cli.group(
    "web",
    invoke_without_command=True,
    short_help="Serve the web dashboard (fleet web url prints the login link).",
)
@click.option(
    "--listen",
    metavar="ADDRESS:PORT",
    help="Listen there instead of web_listen [default: 127.0.0.1:8768].",
)
@click.option("--socket", "socket_path", metavar="PATH", help="Listen on this Unix socket.")
@click.option(
    "--open", "open_browser", is_flag=True, help="Print the login link and open it in a browser."
)
@click.pass_context
def web(
    ctx: click.Context, listen: str | None, socket_path: str | None, open_browser: bool
) -> None:
    """Serve the web dashboard until Ctrl-C: the overview (`fleet status`, live), tasks and
    their live transcripts, the questions agents wait on, analytics and the configuration.

    It listens on 127.0.0.1:8768 by default (web_listen); an address other hosts can reach
    needs web_allow_remote, and should sit behind a TLS proxy. A browser logs in with the
    link of `fleet web url`, which carries the queue's token (kept in the state directory,
    mode 0600). Every action is the command line's own, recorded as web:USER in
    `fleet history`. Under systemd, `fleet setup --web` installs fleet-web.socket, which
    starts fleet-web.service on the first request.
    """
    if ctx.invoked_subcommand is not None:
        return
    from fleet.errors import InputError

    app = ctx.find_object(App)
    assert app is not None
    if listen and socket_path:
        raise InputError("give --listen or --socket, not both")
    serve(app, f"{socket_path}" if socket_path else listen, open_browser)


def serve(app: App, listen_text: str | None, open_browser: bool) -> None:
    from fleet.web import access
    from fleet.web import serve as server
    from fleet.web.app import create

    config = app.config
    # The token before the socket: once it listens, `fleet web url` must find the same one.
    keys = access.Keys(access.load_token(app.paths))
    sock = server.activated()
    if sock is None:
        listen = server.parse(listen_text or config.get_str("web_listen"))
        server.check(listen, config.get_bool("web_allow_remote"))
        sock = server.bind(listen)
    else:
        listen = server.where(sock)
        server.check(listen, config.get_bool("web_allow_remote"))
    hosts = access.allowed_hosts(listen.host, listen.port, config.values["web_hosts"])
    application = create(app.paths, keys, hosts)
    state = application.app.state.web
    sys.stderr.write(f"fleet web: serving {app.paths.home} on {listen.url} (Ctrl-C stops)\n")
    if open_browser:
        url = access.login_url(listen.url, access.load_token(app.paths))
        sys.stdout.write(url + "\n")
        sys.stdout.flush()
        import webbrowser

        # The browser's own launcher (xdg-open, $BROWSER…): not a helper of fleet's.
        webbrowser.open(url)
    server.run(application, sock, state.hub.close, f"serving on {listen.text()}")


@web.command("url")
@click.option(
    "--new-token", is_flag=True, help="Make a new token first: every browser logged in is out."
)
@pass_app
def url(app: App, new_token: bool) -> None:
    """Print the link that logs a browser in to the dashboard (for web_listen).

    Open it once: it sets a cookie and leads to the dashboard. Anyone with the link can act
    as you, so keep it to yourself; --new-token makes the old link and every session void.
    """
    from fleet.web import access
    from fleet.web import serve as server

    listen = server.parse(app.config.get_str("web_listen"))
    token = access.load_token(app.paths, new=new_token)
    sys.stdout.write(access.login_url(listen.url, token) + "\n")
