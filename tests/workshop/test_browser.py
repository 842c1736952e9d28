"""The lessons as a learner meets them: JupyterLab started the way `make lab` starts it, driven by a
real headless Chromium through Playwright. A lesson with live ranks and the untouched exercise of
another are run from the Run menu, and the page must show what nbval cannot see: every rank's
`[stdout:N]`, rendered figures and no progress-bar debris, a kernel that survives its ranks, and the check
cells' verdicts. Screenshots go to runs/browser/.

Notebooks are rewritten often, so cells are found by what they contain, never by position.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import ROOT

SCREENSHOTS = ROOT / "runs" / "browser"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# A cell that shows a figure: the package's plots, matplotlib, or an Image of a saved plot.
SHOWS_FIGURE = re.compile(r"\bplots\.image\(|\bImage\(|\bplt\.")
# tqdm's and ipyparallel's progress bars printed as text: what shows when no widget manager is there.
TEXT_PROGRESS = re.compile(r"\d+%\|.*\|\s*\d+/\d+|IProgress not found")
ERROR_TEXT = re.compile(r"Traceback \(most recent call last\)|\[\d+:execute\]|CompositeError|RemoteError|"
                        r"NotImplementedError|Error displaying widget")
RUN_TIMEOUT_S = 240


def chromium() -> str | None:
    for candidate in (os.environ.get("SCALEDL_CHROMIUM"), "chromium", "chromium-browser"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def code_sources(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    return ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "code"]


def is_check(source: str) -> bool:
    return "checks." in source and "%%px" not in source


class Lab:
    """A JupyterLab server started by tools/lab.sh, as `make lab` starts it."""

    def __init__(self, home: Path):
        self.home = home
        self.token = secrets.token_hex(16)
        self.log_path = home / "lab.log"
        settings, workspaces = home / "settings", home / "workspaces"
        # The lessons are the repository's own files: nothing the run does may be saved into them.
        autosave = settings / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings"
        autosave.parent.mkdir(parents=True)
        autosave.write_text(json.dumps({"autosave": False}))
        # Its own IPython dir: the ipyparallel clusters its kernels start are found (and checked gone) by it.
        self.ipython_dir = home / "ipython"
        env = {**os.environ, "PORT": str(free_port()), "JUPYTER_TOKEN": self.token,
               "IPYTHONDIR": str(self.ipython_dir), "JUPYTER_RUNTIME_DIR": str(home / "runtime")}
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            ["bash", str(ROOT / "tools" / "lab.sh"), f"--LabApp.user_settings_dir={settings}",
             f"--LabApp.workspaces_dir={workspaces}"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = self._address()
        self._wait_until_serving()

    def _address(self) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            match = re.search(r"(http://127\.0\.0\.1:\d+)/lab\?token=(\w+)", self.log_path.read_text())
            if match:
                assert match.group(2) == self.token, "make lab printed another token than JUPYTER_TOKEN"
                return match.group(1)
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        pytest.fail(f"tools/lab.sh printed no address:\n{self.log_path.read_text()[-3000:]}")

    def _wait_until_serving(self) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                self.api("GET", "status")
                return
            except (urllib.error.URLError, ConnectionError):
                if self.process.poll() is not None:
                    break
                time.sleep(0.5)
        pytest.fail(f"JupyterLab did not start:\n{self.log_path.read_text()[-3000:]}")

    def api(self, method: str, path: str, token: str | None = None):
        request = urllib.request.Request(f"{self.url}/api/{path}", method=method,
                                         headers={"Authorization": f"token {token or self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def kernels(self) -> list[dict]:
        return self.api("GET", "kernels")

    def cluster_processes(self) -> list[int]:
        """Processes started with this server's IPython dir: kernels, controllers, engines."""
        marker = f"IPYTHONDIR={self.ipython_dir}".encode()
        found = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and int(proc.name) != self.process.pid:
                try:
                    if marker in (proc / "environ").read_bytes().split(b"\0"):
                        found.append(int(proc.name))
                except OSError:
                    continue
        return found

    def stop(self) -> list[int]:
        """Shut every kernel down as the UI does (so each stops its ranks), then the server; the
        processes of ours still running after 30 s are returned, and killed."""
        try:
            for kernel in self.kernels():
                self.api("DELETE", f"kernels/{kernel['id']}")
            self.api("POST", "shutdown")
        except (urllib.error.URLError, ConnectionError):
            pass
        deadline = time.monotonic() + 30
        while (self.process.poll() is None or self.cluster_processes()) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = self.cluster_processes()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()
        return left


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    server = Lab(tmp_path_factory.mktemp("lab"))
    yield server
    left = server.stop()
    assert not left, f"processes left running after the kernels shut down: {left}"


def test_make_lab_prints_the_address_and_where_to_start(lab):
    printed = lab.log_path.read_text()
    assert f"{lab.url}/lab?token={lab.token}" in printed
    table = (ROOT / "notebooks" / "README.md").read_text()
    lessons = re.findall(r"^\| *(\d+) *\| *\[?`([^`]+\.ipynb)`", table, re.M)
    assert lessons, "notebooks/README.md has no lessons table"
    first = lessons[0][1]
    assert f"{lab.url}/lab/tree/{first}?token={lab.token}" in printed
    for number, path in lessons:
        assert re.search(rf"^\s*{number}\s+{re.escape(path)}\s", printed, re.M), f"lesson {number} not printed"
    # The token is required: without it the server answers 403.
    with pytest.raises(urllib.error.HTTPError) as refused:
        lab.api("GET", "contents", token="wrong")
    assert refused.value.code == 403
    assert lab.api("GET", "contents/notebooks")["type"] == "directory"


# --- the browser ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    if not chromium():
        pytest.skip("no Chromium: `make setup` installs Debian's chromium (tools/install_chromium.sh); "
                    "elsewhere set SCALEDL_CHROMIUM to a Chromium or Chrome binary")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: `make setup` "
                                   "installs it with the test extra")
    with sync_api.sync_playwright() as playwright:
        # The system's Chromium, never a downloaded one; nothing here may reach the network.
        browser = playwright.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Notebook:
    """One lesson open in JupyterLab, in a page of its own."""

    def __init__(self, lab: Lab, browser, path: str):
        self.lab, self.path, self.name = lab, path, Path(path).stem
        self.sources = code_sources(ROOT / path)
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.set_default_timeout(60_000)
        # Every write the page asks of the server: the run must leave the repository's files alone.
        self.writes: list[str] = []
        self.page.on("request", lambda request: self.writes.append(f"{request.method} {request.url}")
                     if request.method in ("PUT", "PATCH") and "/api/contents/" in request.url else None)
        # `reset`: a workspace of its own, without the tabs an earlier lesson left open.
        self.page.goto(f"{lab.url}/lab/tree/{path}?reset&token={lab.token}")
        self.panel = self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
        self.panel.locator(".jp-CodeCell").first.wait_for()
        self.page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for()
        # JupyterLab renders a notebook's cells a few at a time.
        deadline = time.monotonic() + 60
        while self.panel.locator(".jp-CodeCell").count() < len(self.sources) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert self.panel.locator(".jp-CodeCell").count() == len(self.sources), \
            f"{path}: the page shows another number of code cells than the file has"
        # The page shows its cells (and an idle indicator) before the server has started the notebook's
        # kernel; on a loaded machine that takes seconds.  The kernel whose survival the test checks is the
        # one that exists, idle, before anything runs.
        deadline = time.monotonic() + 120
        while not (kernels := lab.kernels()) or any(k["execution_state"] != "idle" for k in kernels):
            if time.monotonic() > deadline:
                pytest.fail(f"{path}: no idle kernel 120 s after the page opened: {kernels}")
            time.sleep(0.5)
        self.kernel_ids = {kernel["id"] for kernel in kernels}

    def cell(self, index: int):
        return self.panel.locator(".jp-CodeCell").nth(index)

    def index(self, predicate, after: int = -1) -> int | None:
        """The first code cell after `after` whose source satisfies `predicate`."""
        return next((i for i, source in enumerate(self.sources) if i > after and predicate(source)), None)

    def menu(self, menu: str, item: str) -> None:
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{menu}$")).click()
        self.page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{item}$")).click()

    def run_all(self) -> float:
        start, before = time.monotonic(), self.prompts()
        self.menu("Run", "Run All Cells")
        self.wait_until_started(before)
        self.wait_until_idle()
        return time.monotonic() - start

    def run_cell(self, index: int) -> None:
        # Clicking the prompt selects the cell without entering its editor, as a learner does.
        before = self.prompts()
        self.cell(index).locator(".jp-InputPrompt").click()
        self.menu("Run", "Run Selected Cell and Do not Advance")
        self.wait_until_started(before)
        self.wait_until_idle()

    def wait_until_started(self, before: list[str], timeout: float = 60) -> None:
        """Until the page shows the run begun (a prompt changed: queued, running or done).  On a loaded
        machine JupyterLab may take seconds to queue what a menu asked, and an idle kernel with untouched
        prompts would otherwise read as a run already over."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.fail_on_dialog()
            if self.prompts() != before:
                return
            time.sleep(0.2)
        self.screenshot("never-started")
        pytest.fail(f"{self.path}: nothing ran {timeout:.0f} s after the menu command: prompts {self.prompts()}")

    def prompts(self) -> list[str]:
        return self.panel.locator(".jp-CodeCell .jp-InputPrompt").evaluate_all(
            "prompts => prompts.map(p => p.textContent.trim())")

    def wait_until_idle(self, timeout: float = RUN_TIMEOUT_S) -> None:
        """Until no cell is queued or running and the kernel is idle, twice in a row a second apart."""
        deadline, calm = time.monotonic() + timeout, 0
        while time.monotonic() < deadline:
            self.fail_on_dialog()
            busy = any("*" in prompt for prompt in self.prompts())
            busy = busy or any(kernel["execution_state"] != "idle" for kernel in self.lab.kernels())
            calm = 0 if busy else calm + 1
            if calm >= 2:
                return
            time.sleep(1)
        self.screenshot("timeout")
        pytest.fail(f"{self.path}: still running after {timeout:.0f} s: prompts {self.prompts()}")

    def fail_on_dialog(self) -> None:
        """A dialog (a dead kernel, a file changed on disk) is a failure, not something to click away."""
        dialogs = self.page.locator(".jp-Dialog")
        if dialogs.count():
            text = dialogs.first.inner_text()
            self.screenshot("dialog")
            pytest.fail(f"{self.path}: JupyterLab showed a dialog: {text}")

    def outputs(self, index: int) -> str:
        return self.cell(index).locator(".jp-OutputArea").evaluate("area => area.textContent")

    def all_outputs(self) -> list[str]:
        return [self.outputs(i) for i in range(len(self.sources))]

    def images(self, index: int) -> list[int]:
        """Widths in pixels of the images the cell's outputs decoded (0: an image that did not load)."""
        return self.cell(index).locator(".jp-OutputArea img").evaluate_all("images => images.map(i => i.naturalWidth)")

    def screenshot(self, what: str, index: int | None = None) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{self.name}-{what}.png"
        if index is None:
            self.page.screenshot(path=path)
        else:
            cell = self.cell(index)
            cell.scroll_into_view_if_needed()
            cell.screenshot(path=path)
        return path

    def screenshot_whole(self) -> Path:
        """The whole notebook in one picture: the viewport made as tall as the notebook."""
        height = self.panel.locator(".jp-WindowedPanel-outer").evaluate(
            "outer => { outer.scrollTop = 0; return outer.scrollHeight; }")
        self.page.set_viewport_size({"width": 1400, "height": min(int(height) + 200, 20_000)})
        self.page.wait_for_timeout(500)
        path = self.screenshot("whole")
        self.page.set_viewport_size({"width": 1400, "height": 1000})
        return path

    def close(self) -> None:
        """Close the page, then shut its kernel down; its ranks must go with it."""
        self.page.close()
        for kernel in self.lab.kernels():
            self.lab.api("DELETE", f"kernels/{kernel['id']}")
        deadline = time.monotonic() + 30
        while self.lab.cluster_processes() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not self.lab.cluster_processes(), f"{self.path}: ranks still running after its kernel shut down"
        assert not self.writes, f"{self.path}: the page saved files: {self.writes}"

    def check_kernel_survived(self) -> None:
        kernels = self.lab.kernels()
        assert {kernel["id"] for kernel in kernels} == self.kernel_ids, \
            f"{self.path}: the kernel was replaced (it died and restarted): {kernels}"
        assert "Kernel Restarting" not in self.page.content()

    def check_no_progress_debris(self, outputs: list[str]) -> None:
        """Starting the ranks and `%%px` draw no progress bar (a saved notebook would keep only its first
        frame): the start cell says how many ranks are up, and nothing shows as a text bar or a broken widget."""
        text_bars = [text for text in outputs if TEXT_PROGRESS.search(text)]
        assert not text_bars, f"{self.path}: progress bars printed as text: {text_bars[:2]}"
        bars = self.panel.locator(".jp-OutputArea :is(.widget-hprogress, .jupyter-widget-hprogress)")
        assert bars.count() == 0, f"{self.path}: a progress bar widget in the outputs"
        assert any(re.search(r"\d+ ranks up \(", text) for text in outputs), f"{self.path}: no 'ranks up' line"
        broken = self.panel.locator(".jp-OutputArea").get_by_text(re.compile("Error displaying widget|Loading widget"))
        assert broken.count() == 0, f"{self.path}: a widget did not render: {broken.first.inner_text()}"


def solution_with_ranks() -> str:
    """A lesson whose answers start live ranks: collectives, else DDP, else any with %%px."""
    candidates = ["solutions/03_collectives.ipynb", "solutions/06_ddp.ipynb",
                  *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "solutions").glob("*.ipynb"))]
    for path in candidates:
        sources = code_sources(ROOT / path) if (ROOT / path).exists() else []
        if any(s.startswith("%%px") for s in sources) and any(is_check(s) for s in sources):
            return path
    pytest.fail("no lesson in solutions/ starts ranks (%%px) and has a check cell")


def exercise_with_ranks(other_than: str) -> str:
    names = ["06_ddp.ipynb", "03_collectives.ipynb",
             *sorted(p.name for p in (ROOT / "exercises").glob("*.ipynb"))]
    for name in names:
        path = ROOT / "exercises" / name
        if name != Path(other_than).name and path.exists():
            sources = code_sources(path)
            if any(s.startswith("%%px") for s in sources) and any(is_check(s) for s in sources):
                return f"exercises/{name}"
    pytest.fail("no exercise with live ranks and a check cell besides " + other_than)


@pytest.mark.slow
def test_lesson_with_ranks_shows_every_rank_and_passes(lab, browser):
    notebook = Notebook(lab, browser, solution_with_ranks())
    try:
        seconds = notebook.run_all()
        prompts, outputs = notebook.prompts(), notebook.all_outputs()
        notebook.screenshot_whole()
        not_run = [i for i, prompt in enumerate(prompts) if not re.fullmatch(r"\[\d+\]:", prompt)]
        assert not not_run, f"{notebook.path}: the run stopped before code cell {not_run[0]}; the cell before " \
                            f"it showed:\n{outputs[not_run[0] - 1][-2000:]}"
        errors = {notebook.sources[i].splitlines()[-1]: text[-1500:] for i, text in enumerate(outputs)
                  if ERROR_TEXT.search(text)}
        assert not errors, f"{notebook.path}: a learner sees errors under these cells: {errors}"
        # Every rank's output, under its own [stdout:N] header, in the first cell that prints from the ranks.
        first_px = notebook.index(lambda s: s.startswith("%%px") and "print(" in s)
        assert first_px is not None
        shown = notebook.outputs(first_px)
        ranks = sorted(int(n) for n in re.findall(r"\[stdout:(\d+)\]", shown))
        assert len(ranks) >= 2 and ranks == list(range(len(ranks))), f"ranks' outputs: {shown[:1000]}"
        notebook.screenshot("ranks", first_px)
        # Figures: every cell that shows one has an image the browser decoded.
        for i in (i for i, source in enumerate(notebook.sources) if SHOWS_FIGURE.search(source)):
            widths = notebook.images(i)
            assert widths and all(widths), f"no figure rendered by {notebook.sources[i]!r}: {outputs[i][-500:]}"
            notebook.screenshot("figure", i)
        checks = [i for i, source in enumerate(notebook.sources) if is_check(source)]
        assert checks
        for i in checks:
            assert "PASS:" in outputs[i] and "FAIL:" not in outputs[i], (notebook.sources[i], outputs[i])
        notebook.screenshot("check", checks[0])
        notebook.check_no_progress_debris(outputs)
        notebook.check_kernel_survived()
        print(f"{notebook.path}: {len(prompts)} code cells, {len(ranks)} ranks, run all in {seconds:.1f} s")
    finally:
        notebook.close()


@pytest.mark.slow
def test_untouched_exercise_shows_fail(lab, browser):
    notebook = Notebook(lab, browser, exercise_with_ranks(other_than=solution_with_ranks()))
    try:
        seconds = notebook.run_all()
        blank = notebook.index(lambda source: "raise NotImplementedError" in source)
        assert blank is not None, f"{notebook.path} has no blank to fill"
        assert "NotImplementedError" in notebook.outputs(blank), notebook.outputs(blank)[-1500:]
        notebook.screenshot("blank", blank)
        check = notebook.index(is_check, after=blank)
        assert check is not None, f"{notebook.path}: no check cell after the first blank"
        # Run All stops at the blank's error (unless the cell is tagged raises-exception); a learner
        # then runs the check cell, which must say what to fix.
        stopped = not re.fullmatch(r"\[\d+\]:", notebook.prompts()[check])
        if stopped:
            notebook.run_cell(check)
        verdict = notebook.outputs(check)
        assert ("FAIL:" in verdict or "NOT ATTEMPTED YET:" in verdict) and "PASS:" not in verdict, \
            (notebook.sources[check], verdict[-1500:])
        notebook.screenshot("check", check)
        notebook.screenshot_whole()
        notebook.check_kernel_survived()
        print(f"{notebook.path}: run all in {seconds:.1f} s, "
              f"{'stopped at the blank' if stopped else 'ran through the blank'}, check does not pass")
    finally:
        notebook.close()
