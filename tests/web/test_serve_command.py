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


def test_a_server_on_ipv6_loopback_answers_its_bracketed_host_and_refuses_another():
    import socket
    import time
    import urllib.error
    import urllib.request

    import pytest

    pytest.importorskip("uvicorn", reason="uvicorn is not installed (the web extra)")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            port = probe.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    proc = subprocess.Popen([sys.executable, "-m", "paraplan.cli", "serve", "--host", "::1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://[::1]:{port}/static/style.css"
    try:
        for _ in range(300):
            try:
                assert urllib.request.urlopen(url, timeout=1).status == 200  # Host: [::1]:port
                break
            except urllib.error.URLError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.1)
        else:
            pytest.fail("paraplan serve --host ::1 did not answer")
        refused = urllib.request.Request(url, headers={"Host": f"[::2]:{port}"})
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(refused, timeout=5)
        assert answer.value.code == 400
    finally:
        proc.terminate()
        proc.wait(timeout=10)
