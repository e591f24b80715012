"""A real JupyterLab on 127.0.0.1 driven by Playwright in headless Debian Chromium.

Opens the quickstart notebook, runs it, checks that the widgets render real data, clicks APPROVE
on the pending proposal and finds the answer in the ledger, selects a group in the RolloutBrowser
and sees all its samples with advantages. Screenshots go to test-artifacts/browser/.
"""
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROME_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory, data_dir):
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed: run scripts/setup-browser.sh (scripts/test.sh does)")
    work = tmp_path_factory.mktemp("lab")
    nb_dir = work / "notebooks"
    shutil.copytree(ROOT / "notebooks", nb_dir)
    settings = work / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false",
                                                                          "checkForUpdates": False}))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, EVOTRAINER_DATA=str(data_dir), PYTHONPATH=str(ROOT),
               EVOTRAINER_NOTEBOOK_CAMPAIGN=str(work / "campaign"), EVOTRAINER_NOTEBOOK_INTERACTIVE="1",
               JUPYTER_CONFIG_DIR=str(work / "config"), JUPYTERLAB_SETTINGS_DIR=str(work / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(work / "workspaces"), JUPYTER_RUNTIME_DIR=str(work / "runtime"))
    log = open(work / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={nb_dir}", "--ServerApp.port_retries=0",
         *(["--ServerApp.allow_root=True"] if os.geteuid() == 0 else [])],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.3)
    else:
        proc.kill()
    if proc.poll() is not None:
        pytest.fail("JupyterLab did not start:\n" + (work / "jupyterlab.log").read_text()[-3000:])
    yield {"base": base, "token": token, "campaign": work / "campaign", "work": work}
    os.killpg(proc.pid, 15)
    proc.wait(timeout=30)
    from evotrainer.lab import Lab
    from evotrainer.store import Store

    if Store.exists(work / "campaign"):
        Lab.attach(work / "campaign").stop()


def _shot(page, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_quickstart_in_a_real_jupyterlab(jupyterlab):
    from playwright.sync_api import expect, sync_playwright

    from evotrainer.store import Store

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.set_default_timeout(120_000)
        try:
            page.goto(f"{jupyterlab['base']}/lab/tree/quickstart.ipynb?token={jupyterlab['token']}")
            page.wait_for_selector(".jp-Notebook", state="visible")
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle'], .jp-mod-idle",
                                   state="attached", timeout=120_000)
            # The notebook's cells must be loaded and its kernel started before "Run All": an idle
            # indicator can show while the document is still initialising ("No Kernel | Initializing"),
            # and Run All then runs nothing.
            page.wait_for_function("document.querySelectorAll('.jp-Notebook .jp-Cell').length > 3",
                                   timeout=120_000)
            page.wait_for_function("!document.body.innerText.includes('No Kernel')", timeout=120_000)
            page.wait_for_function("document.body.innerText.includes('| Idle')", timeout=120_000)
            _shot(page, "01-opened")
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_text("Run All Cells", exact=True).click()
            # the campaign view renders real versions from the store
            view = page.locator(".evo-campaign-view").first
            expect(view).to_be_visible(timeout=240_000)
            expect(view).to_contain_text("v000", timeout=240_000)
            # the proposal queue shows the pending design gate with the agent's proposals
            queue = page.locator(".evo-proposal-queue").first
            expect(queue).to_be_visible(timeout=240_000)
            expect(queue.locator("[data-action='approve']").first).to_be_visible(timeout=240_000)
            _shot(page, "02-ran")
            queue.locator("textarea[data-field='reason'], input[data-field='reason']").first.fill("looks right")
            who = queue.locator("input[data-field='who']")
            if who.count():
                who.first.fill("playwright")
            queue.locator("[data-action='approve']").first.click()
            store = Store.open(jupyterlab["campaign"])
            deadline = time.monotonic() + 60
            answers = []
            while time.monotonic() < deadline and not answers:
                answers = [e for e in store.ledger.events() if e.kind == "gate_answered" and e.gate == "design"]
                time.sleep(0.2)
            assert answers, "clicking APPROVE wrote no gate answer to the ledger"
            assert answers[0].reason == "looks right" and answers[0].answer in ("approve", "revise")
            _shot(page, "03-approved")
            # select a group in the rollout browser: all its samples with their advantages
            rb = page.locator(".evo-rollout-browser").first
            expect(rb).to_be_visible()
            rb.locator("[data-group-id]").first.click()
            group = page.locator(".evo-group-view").first
            expect(group).to_be_visible()
            gid = rb.locator("[data-group-id]").first.get_attribute("data-group-id")
            train = store.rollouts(split="train").collect()
            expected = train.filter(train["group_id"] == gid)
            samples = group.locator("[data-sample-idx]")
            expect(samples).to_have_count(expected.height)
            text = group.inner_text()
            assert "advantage" in text.lower()
            for adv in expected["advantage"].to_list():
                assert f"{adv:+.3f}" in text or f"{adv:.3f}" in text, (adv, text[:500])
            _shot(page, "04-group")
            # the workbench at the end of the notebook holds all five views, rendered by the frontend
            for cls in ("evo-campaign-view", "evo-rollout-browser", "evo-backtest-compare", "evo-proposal-queue",
                        "evo-diagnostic-editor"):
                assert page.locator(f".{cls}").count() >= 1, f"{cls} never rendered"
            expect(page.locator(".evo-campaign-view tr.evo-version[data-version='v000']").first).to_be_attached()
        except Exception:
            _shot(page, "99-failure")
            raise
        finally:
            browser.close()
