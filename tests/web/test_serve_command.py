"""`paraplan serve` as a command: the core CLI does not import the web extra, and bad flags
end in one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from paraplan.cli.app import app

WEB = ("starlette", "uvicorn", "jinja2", "paraplan.web")


def test_the_cli_imports_no_web_module_until_serve_runs():
    code = ("import json, sys; from paraplan.cli.app import app; "
            f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({WEB!r}))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout) == []


def test_serve_binds_this_machine_only_unless_told():
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert "127.0.0.1" in result.output


def test_a_port_out_of_range_is_one_line_with_exit_code_2():
    result = CliRunner().invoke(app, ["serve", "--port", "70000"])
    assert result.exit_code == 2
    assert "--port: expected 1-65535, got 70000" in result.output


def test_a_port_in_use_is_one_line_with_exit_code_2():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--port", str(port)])
    assert result.exit_code == 2
    assert f"--port: cannot listen on 127.0.0.1:{port}" in result.output
