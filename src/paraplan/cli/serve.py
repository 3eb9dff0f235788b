"""`paraplan serve`: the local web page (needs the web extra: pip install "paraplan[web]")."""

from __future__ import annotations

from typing import Annotated

import typer

from paraplan.cli.common import err, user_errors

Opt = typer.Option



def serve_command(
    port: Annotated[int, Opt(help="Port to listen on.")] = 8000,
    host: Annotated[str, Opt(help="Address to bind: 127.0.0.1 serves this machine only; 0.0.0.0 "
                                  "serves every network the machine is on (no login: anyone there can use it).")]
    = "127.0.0.1",
) -> None:
    """Serve a local web page to predict, search and compare plans, and download their job
    files, launch recipes and reports. Ctrl-C stops it."""
    from paraplan.specs import ConfigError

    with user_errors():
        if not 1 <= port <= 65535:
            raise ConfigError(f"--port: expected 1-65535, got {port}")
        _check_free(host, port)
        import uvicorn  # (user_errors names the web extra when it is missing)

        from paraplan.web.app import create_app
    local = host in ("127.0.0.1", "localhost", "::1")
    hosts = ["127.0.0.1", "localhost", "[::1]"] if local else ["*"]
    if not local:
        err.print(f"note: serving every address of {host}; anyone who reaches this machine can use the page",
                  highlight=False, soft_wrap=True)
    config = uvicorn.Config(create_app(allowed_hosts=hosts), host=host, port=port, log_level="warning",
                            access_log=False, limit_concurrency=64)
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    err.print(f"paraplan serve: http://{shown}:{port}/ (Ctrl-C stops it)", highlight=False, markup=False)
    server.run()


def _check_free(host: str, port: int) -> None:
    """The address can be bound (else one line, exit 2, rather than the server's log)."""
    import socket

    from paraplan.specs import ConfigError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(f"--host: cannot resolve {host!r} ({exc.strerror or exc})") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise ConfigError(f"--port: cannot listen on {host}:{port} ({exc.strerror or exc}); "
                              "pass another --port") from None
