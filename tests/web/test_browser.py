"""The page in a real browser: headless Chromium (Debian's chromium package) driven by
Playwright, against ``paraplan serve`` started on a free port of 127.0.0.1. Each page is filled
in, shows a number and a picture, shows a bad value's message beside its field, and downloads
a recipe. Screenshots of each page at 1280 and 390 px go to $PARAPLAN_SCREENSHOTS when set."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt-get install chromium)"),
]
playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the webtest extra)")
pytest.importorskip("uvicorn", reason="uvicorn is not installed (the web extra)")

from tests.web.helpers import HF_CONFIG  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WIDTHS = (1280, 390)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "paraplan.cli", "serve", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/static/style.css", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"paraplan serve ended: {proc.stdout.read()}")
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    # (Playwright's waits evaluate text, which the page's Content-Security-Policy forbids; the
    # policy itself is held by test_the_page_runs_under_its_content_security_policy)
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True, bypass_csp=True)
    page = context.new_page()
    yield page
    context.close()


def shoot(page, name: str) -> None:
    folder = os.environ.get("PARAPLAN_SCREENSHOTS")
    if not folder:
        return
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(300)
        page.screenshot(path=str(Path(folder) / f"{name}-{width}.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})


def pictures_loaded(page, root: str) -> int:
    page.wait_for_function(f"""() => {{
        const imgs = [...document.querySelectorAll('{root} .pictures img')];
        return imgs.length === 3 && imgs.every((i) => i.complete && i.naturalWidth > 0);
    }}""", timeout=30_000)
    return page.locator(f"{root} .pictures img").count()


def test_the_predict_page_updates_as_a_field_changes_and_shows_its_pictures(page, server):
    page.goto(server + "/")
    first = page.locator("#prediction .iteration")
    first.wait_for()
    before = first.inner_text()
    page.fill("#job [name=tp]", "4")
    page.wait_for_function(f"document.querySelector('#prediction .iteration').innerText !== {before!r}")
    assert page.locator("#prediction .iteration").inner_text().endswith("s")
    assert pictures_loaded(page, "#prediction") == 3
    shoot(page, "predict")


def test_the_page_runs_under_its_content_security_policy(browser, server):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    said: list[str] = []
    page.on("console", lambda message: said.append(message.text))
    page.goto(server + "/")
    page.locator("#prediction .iteration").wait_for()
    page.fill("#job [name=tp]", "3")
    page.locator('#job .field[data-field="tp"] .msg').wait_for(state="visible")
    page.fill("#job [name=tp]", "4")
    page.locator('#job .field[data-field="tp"] .msg').wait_for(state="hidden")
    page.locator("#prediction figure.memory img").wait_for()
    page.wait_for_load_state("networkidle")
    context.close()
    assert [m for m in said if "Content Security Policy" in m] == []


def test_the_interval_shows_on_the_cards_and_changes_with_its_level(page, server):
    page.goto(server + "/")
    bounds = page.locator("#prediction .card.time .interval")
    bounds.wait_for()
    before = bounds.inner_text()
    assert before.startswith("(80 %: ") and before.endswith(" s)")
    assert page.locator("#prediction .interval-rule li").first.inner_text().startswith("80 % interval: ")
    page.fill("#job [name=interval]", "0.5")
    page.wait_for_function("document.querySelector('#prediction .card.time .interval').innerText.startsWith('(50 %: ')")
    assert bounds.inner_text() != before
    assert page.locator("#prediction .card .interval").count() >= 3  # time, tokens/s, MFU (and the cost figures)
    page.fill("#job [name=interval]", "2")
    message = page.locator('#job .field[data-field="interval"] .msg')
    message.wait_for(state="visible")
    assert "--interval" in message.inner_text()


def test_a_bad_plan_shows_the_packages_message_beside_its_field(page, server):
    page.goto(server + "/")
    page.locator("#prediction .iteration").wait_for()
    page.fill("#job [name=tp]", "3")
    message = page.locator('#job .field[data-field="tp"] .msg')
    message.wait_for(state="visible")
    assert message.inner_text() == ("parallel: tp*pp*cp = 3 does not divide the cluster's 32 GPUs "
                                    "(cluster.num_nodes 4 x cluster.gpus_per_node 8)")
    shoot(page, "predict-error")
    page.fill("#job [name=tp]", "2")
    message.wait_for(state="hidden")


def test_a_recipe_downloads_from_the_predict_page(page, server):
    page.goto(server + "/")
    page.locator("#prediction .iteration").wait_for()
    with page.expect_download() as info:
        page.click("#prediction [data-download=megatron]")
    text = Path(info.value.path()).read_text()
    assert "--tensor-model-parallel-size 2" in text


def test_an_uploaded_hugging_face_config_is_predicted_and_a_hostile_one_named(page, server, tmp_path):
    page.goto(server + "/")
    page.locator("#prediction .iteration").wait_for()
    page.check("#job [name=model_source][value=hf]")
    config = tmp_path / "config.json"
    config.write_bytes(HF_CONFIG)
    page.fill("#job [name=seq_length]", "2048")
    page.set_input_files("#job input.upload", str(config))
    page.wait_for_function("document.querySelector('#prediction .seq').innerText.includes('seq_length 2,048 tokens')")
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1, "a": 2}')
    page.set_input_files("#job input.upload", str(bad))
    message = page.locator('#job .field[data-field="hf_config"] .msg')
    message.wait_for(state="visible")
    assert message.inner_text() == "bad.json: duplicate key 'a' in one object"


def test_the_search_page_ranks_plans_and_a_clicked_plan_is_predicted(page, server):
    page.goto(server + "/search")
    page.fill("#search [name=num_nodes]", "1")
    page.fill("#search [name=global_batch_size]", "64")
    page.fill("#search [name=tp]", "1,2,4")
    page.click("#run")
    rows = page.locator(".plans table tbody tr")
    rows.first.wait_for(timeout=60_000)
    assert rows.count() >= 2
    header = page.locator(".plans table thead").inner_text()
    assert "80 %" in header and "iter s" in header  # each plan's interval, as paraplan search shows it
    assert page.locator(".summary .interval-rule").first.inner_text().startswith("80 % intervals")
    page.locator(".pareto img").wait_for()
    rows.nth(1).click()
    assert pictures_loaded(page, "#prediction") == 3
    page.locator(".plans input[type=checkbox]").nth(0).check()
    page.locator(".plans input[type=checkbox]").nth(1).check()
    page.click("#compare-picked")
    page.locator(".comparison table.compare").wait_for()
    assert pictures_loaded(page, "#prediction") == 3
    shoot(page, "search")
    iteration = page.locator("#prediction .iteration").inner_text()
    page.click("#prediction a.open")
    page.wait_for_url("**/?*")
    page.wait_for_function(f"document.querySelector('#prediction .iteration')?.innerText === {iteration!r}")


def test_the_search_page_searches_a_cluster_typed_inline(page, server):
    page.goto(server + "/search")
    page.check("#search [name=cluster_source][value=mapping]")
    page.fill("#search [name=cluster_yaml]", "name: my-cluster\ngpu: H100-SXM5-80GB\ngpus_per_node: 8\nnum_nodes: 2\n"
              "intra_node: {bandwidth: 450 GB/s}\ninter_node: {bandwidth: 50 GB/s, latency: 5 us}\n")
    page.fill("#search [name=global_batch_size]", "64")
    page.fill("#search [name=tp]", "1,2")
    page.click("#run")
    page.locator(".plans table tbody tr").first.wait_for(timeout=60_000)
    page.locator(".plans table tbody tr").first.click()
    page.wait_for_function("document.querySelector('#prediction .what')?.innerText.includes('16 x H100-SXM5-80GB (my-cluster)')")
    page.fill("#search [name=cluster_yaml]", "gpu: H1000\nnum_nodes: 2")
    assert "H1000" in _search_message(page, "cluster_yaml")


def test_a_bad_search_list_is_named_beside_its_field(page, server):
    page.goto(server + "/search")
    page.fill("#search [name=tp]", "1,x")
    assert "tp" in _search_message(page, "tp")


def _search_message(page, field: str) -> str:
    """Run the search form and read the one-line message shown beside ``field``."""
    page.click("#run")
    message = page.locator(f'#search .field[data-field="{field}"] .msg')
    message.wait_for(state="visible")
    return message.inner_text()


def test_a_long_search_shows_progress_and_cancels(page, server):
    page.goto(server + "/search")
    page.fill("#search [name=sizes]", "4,8,16,32,64")
    page.select_option("#search [name=space]", "full")
    page.select_option("#search [name=model]", "llama-3-70b")
    page.click("#run")
    page.locator("#progress").wait_for(state="visible")
    page.wait_for_function("document.querySelector('#status').innerText.startsWith('screening every plan')")
    page.wait_for_function("document.querySelector('#progress').value > 0")  # it moves while the screen runs
    page.click("#cancel")
    page.wait_for_function("document.querySelector('#status').innerText.startsWith('cancelled')", timeout=60_000)
    assert page.locator(".plans table").count() == 0


def test_the_compare_page_shows_b_minus_a(page, server):
    page.goto(server + "/compare")
    table = page.locator("#comparison table.compare")
    table.wait_for()
    assert "iteration" in table.inner_text()
    page.fill("#job-b [name=tp]", "5")
    message = page.locator('#job-b .field[data-field="tp"] .msg')
    message.wait_for(state="visible")
    assert "tp*pp*cp = 5" in message.inner_text()
    page.fill("#job-b [name=tp]", "8")
    page.wait_for_function("document.querySelector('#comparison').innerText.includes('tp 2 -> 8')")
    assert pictures_loaded(page, "#prediction-b") == 3
    shoot(page, "compare")


def test_ten_tabs_each_predict_their_own_plan(browser, server):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, bypass_csp=True)
    tabs = [context.new_page() for _ in range(10)]
    sizes = [1, 2, 4, 8, 1, 2, 4, 8, 2, 4]
    for tab in tabs:
        tab.goto(server + "/")
    for tab, tp in zip(tabs, sizes, strict=True):
        tab.locator("#prediction .iteration").wait_for()
        tab.fill("#job [name=tp]", str(tp))
    for tab, tp in zip(tabs, sizes, strict=True):
        tab.wait_for_function(f"document.querySelector('#prediction .what').innerText.includes(', tp={tp} ')")
        assert pictures_loaded(tab, "#prediction") == 3
    context.close()


def test_a_prediction_round_trip_from_the_page_is_timed(page, server):
    """Measured in the browser: fetch of /api/predict to its parsed JSON (reported, and bound
    as a ratio: no more than 20 times a request for the page's small stylesheet)."""
    page.goto(server + "/")
    page.locator("#prediction .iteration").wait_for()
    times = page.evaluate("""async () => {
        const form = Object.fromEntries([...document.querySelectorAll('#job [name]')]
            .filter((e) => e.type !== 'radio' || e.checked).filter((e) => e.type !== 'file').map((e) => [e.name, e.value]));
        const h = {'Content-Type': 'application/json', 'X-Paraplan': '1'};
        const best = {predict: Infinity, css: Infinity};
        for (let i = 0; i < 15; i++) {
            form.tp = String([1, 2, 4, 8][i % 4]);
            let t = performance.now();
            await (await fetch('/api/predict', {method: 'POST', headers: h, body: JSON.stringify(form)})).json();
            best.predict = Math.min(best.predict, performance.now() - t);
            t = performance.now();
            await (await fetch('/static/style.css?' + i)).text();
            best.css = Math.min(best.css, performance.now() - t);
        }
        return best;
    }""")
    print(f"prediction round trip {times['predict']:.1f} ms; stylesheet {times['css']:.1f} ms")
    assert times["predict"] <= 20 * max(times["css"], 1.0)
