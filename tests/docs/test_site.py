"""The site builds strict and offline, and every page loads in a real browser without a broken link or image.

The browser check serves the built site on 127.0.0.1 and loads every page it can reach from the home page in
headless chromium (Debian's ``/usr/bin/chromium``; skipped where it is missing): no console error, no failed
request, no image that did not load, no link to a local page that does not answer 200, no link to an anchor that
is not on its page.

Note [one search index]: every page's search loads the same ``search/search_index.json`` (a megabyte: the theme
parses it and builds its lunr index on each page load, most of the browser's CPU in the check). The page's base, the
only thing that makes a page's request differ, is the same for every page at one depth of the site; so the first
page of each depth loads the real index and the others are answered an index with its configuration and no
documents. A page that asks for another URL (a broken base) still asks the server, and fails the check.

Note [one template, one browser load]: the API reference is a hundred pages of one template (mkdocstrings'), whose
scripts are the theme's, as on every page. A few of them load in the browser; the rest are read as HTML (links,
anchors and images checked the same way, no script run), which takes a twentieth of the time.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urldefrag, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
# A build takes a minute or two on a quiet machine; a loaded one has run past pytest's 300 s. The test that first
# asks for the site builds it, so every test on the site gets this timeout, and the build a little less.
SITE_TIMEOUT = 900
#: Pages of the API reference loaded in the browser; the others are read as HTML (Note [one template, one browser
#: load]).
BROWSED_REFERENCE = 3


def build_site(site_dir: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """``mkdocs build --strict`` into ``site_dir``; the completed process and its wall time in seconds."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=SITE_TIMEOUT - 60,
    )
    return proc, time.perf_counter() - t0


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site_dir = tmp_path_factory.mktemp("site")
    proc, _ = build_site(site_dir)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return site_dir


@pytest.mark.timeout(SITE_TIMEOUT)
@pytest.mark.slow
def test_site_builds_strict(site: Path) -> None:
    for page in ("index.html", "concepts/bubble/index.html", "ablation/index.html", "tutorials/01_bubble/index.html",
                 "reference/gpipe.schedule/index.html", "reference/index.html", "img/generated/bubble_gantt.png",
                 "img/generated/deferred_bn.png", "img/demo_timeline.png",
                 "tutorials/01_bubble.ipynb", "search/search_index.json"):
        assert (site / page).is_file(), f"the site lacks {page}"
    from tests.docs.test_figures import _load

    # every figure a page's module registers is drawn by the build, the one place each is drawn in a test run
    drawn = {p.name for p in (site / "img" / "generated").glob("*.png") if p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"}
    missing = set(_load("make_figures").FIGURES) - drawn
    assert not missing, f"the build drew no PNG for {sorted(missing)}"
    html = (site / "index.html").read_text()
    assert "fonts.googleapis.com" not in html, "the theme must not load Google Fonts (theme.font: false)"


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hook_figures", ROOT / "docs" / "hooks" / "figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Modules the reference must have, once their file exists (issue 5: the executor's modules among them).
REQUIRED_REFERENCE = ("gpipe.schedule", "gpipe.pipe", "gpipe.skip", "gpipe.batchnorm", "gpipe.balance",
                      "gpipe.autograd.phase", "gpipe.profiling.profile", "sim.core.engine", "sim.core.cost",
                      "sim.calibration.compare", "sim.calibration.calibrate", "sim.calibration.primitives",
                      "sim.calibration.experiment", "sim.calibration.outcome", "sim.planning.hardware.catalog")


def test_the_reference_lists_every_public_module() -> None:
    hook = _hook()
    modules = hook.reference_modules()
    present = [m for m in REQUIRED_REFERENCE
               if (ROOT / f"{m.replace('.', '/')}.py").is_file() or (ROOT / m.replace(".", "/")).is_dir()]
    assert set(present) <= set(modules)
    assert not [m for m in modules if m.split(".")[-1].startswith("_")]
    page = hook.reference_page("gpipe.schedule")
    assert page.startswith("# `gpipe.schedule`") and "::: gpipe.schedule" in page
    # a package's modules keep their docstrings (the notes) on its page, without their members
    assert {"task", "validator", "registry"} <= set(hook.submodules("gpipe.schedule"))
    assert "::: gpipe.schedule.task\n    options:\n      members: false\n" in page
    assert hook.submodules("gpipe.schedule.timeline") == []


def test_a_function_shadowed_by_its_submodule_gets_rendered(tmp_path: Path) -> None:
    package = tmp_path / "pkg" / "sub"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('from pkg.sub.thing import thing\nfrom pkg.sub import other\n'
                                         '__all__ = ["thing", "other"]\n')
    (package / "thing.py").write_text("def thing():\n    pass\n")
    (package / "other.py").write_text("X = 1\n")
    hook = _hook()
    assert hook.shadowed_exports("pkg.sub", tmp_path) == ["thing"]
    assert "::: pkg.sub.thing.thing" in hook.reference_page("pkg.sub", tmp_path)


@pytest.mark.timeout(SITE_TIMEOUT)
@pytest.mark.slow
def test_reference_pages_render_the_docstrings(site: Path) -> None:
    for module in _hook().reference_modules():
        html = (site / "reference" / module / "index.html").read_text()
        assert f'id="{module}"' in html, f"the reference page of {module} does not render the module"
    index = (site / "reference" / "index.html").read_text()
    assert "sim.core.engine" in index and "gpipe.schedule" in index


@pytest.mark.timeout(SITE_TIMEOUT)
@pytest.mark.slow
def test_site_loads_nothing_remote(site: Path) -> None:
    """No page pulls a script, stylesheet or font from another host (links to papers are fine)."""
    import re

    remote = re.compile(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=\"(?:https?:)?//", re.IGNORECASE)
    offenders = [str(p.relative_to(site)) for p in site.rglob("*.html") if remote.search(p.read_text())]
    assert not offenders, f"pages that load remote resources: {offenders}"


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10) as response:
            return int(response.status)  # HEAD: the status without the body (a notebook, the search index)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _is_page(url: str) -> bool:
    path = urlparse(url).path
    return path.endswith("/") or path.endswith(".html")


@pytest.mark.timeout(SITE_TIMEOUT)
@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs Debian's chromium at {CHROMIUM}")
def test_every_page_loads_in_chromium(site: Path, served: str) -> None:
    import json

    from _cdp import Chromium, read

    base = served
    index = base + "search/search_index.json"
    empty = json.dumps({**json.loads((site / "search" / "search_index.json").read_text()), "docs": []}).encode()
    depths: set[int] = set()  # depths of the site whose first page loaded the real index (Note [one search index])
    problems: list[str] = []
    seen_pages: dict[str, set[str]] = {}  # page url -> ids on it
    wanted_anchors: list[tuple[str, str, str]] = []  # (from page, target page, fragment)
    checked: dict[str, int] = {}
    queue = [base]
    browsed_reference = 0
    with Chromium(CHROMIUM) as browser:
        while queue:
            url = queue.pop(0)
            if url in seen_pages:
                continue
            path = urlparse(url).path
            if path.startswith("/reference/") and browsed_reference >= BROWSED_REFERENCE:
                report = read(url)  # Note [one template, one browser load]
            else:
                depth = path.count("/")
                browser.answer(index, None if depth not in depths else empty)
                depths.add(depth)
                report = browser.load(url)
                browsed_reference += path.startswith("/reference/")
            seen_pages[url] = report.ids
            problems += [f"{url}: {e}" for e in report.errors]
            problems += [f"{url}: image did not load: {src}" for src in report.broken_images]
            for href in report.links:
                target, fragment = urldefrag(href)
                if not target.startswith(base):
                    continue  # another host: not fetched (the check is offline)
                if target not in checked:
                    checked[target] = _status(target)
                    if checked[target] != 200:
                        problems.append(f"{url}: broken link {href} (HTTP {checked[target]})")
                if checked[target] == 200 and _is_page(target):
                    if target not in seen_pages and target not in queue:
                        queue.append(target)
                    if fragment:
                        wanted_anchors.append((url, target, fragment))
    for source, target, fragment in wanted_anchors:
        if fragment not in seen_pages.get(target, set()):
            problems.append(f"{source}: link to #{fragment} on {target}, which has no such id")
    sys.stderr.write(f"browser check: {len(seen_pages)} pages, {len(checked)} local URLs, "
                     f"{len(wanted_anchors)} anchors\n")
    assert len(seen_pages) >= 20, f"the crawl reached only {len(seen_pages)} pages: {sorted(seen_pages)}"
    assert not problems, "\n".join(problems)


_STATE_JS = """JSON.stringify({weight: document.getElementById('explorer-weight').disabled,
  panels: ['', '-2'].map(function (x) { var g = function (id) { return document.getElementById('explorer-' + id + x); };
    var all = function (id, css, f) { return Array.from(g(id).querySelectorAll(css)).map(f); };
    return {key: g('gantt').getAttribute('data-key'), spans: g('gantt').querySelectorAll('rect.span').length,
            lines: g('memory').querySelectorAll('polyline.memory').length, summary: g('summary').textContent,
            paired: g('gantt').querySelectorAll('rect.paired').length,
            units: all('panel', 'text.axis-label', function (t) { return t.textContent; }),
            strokes: all('memory', 'polyline.memory', function (l) { return l.getAttribute('stroke'); }),
            legend: all('memory', 'rect.legend', function (r) { return r.getAttribute('fill'); }),
            form: g('form').textContent, scale: Number(document.getElementById('explorer-panel' + x).dataset.scale),
            shown: document.getElementById('explorer-panel' + x).style.display !== 'none'}; })})"""


def _set(name: str, value: str) -> str:
    """Move a control as a reader would: a select to ``value``, a slider to the index of ``value`` on its axis."""
    return (f"(function () {{ var s = document.getElementById('explorer-{name}');"
            f" s.value = s.tagName === 'SELECT' ? '{value}'"
            f" : String(window.EXPLORER.axes['{name}'].indexOf('{value}'));"
            f" s.dispatchEvent(new Event('change')); return s.value; }})()")


def _drawn(browser: Any, *keys: str) -> dict[str, Any]:
    """The explorer's state once its panels drew ``keys`` (a schedule's pack loads and inflates asynchronously)."""
    import json

    deadline = time.monotonic() + 20
    while True:
        state = json.loads(browser.evaluate(_STATE_JS))
        if [p["key"] for p in state["panels"][:len(keys)]] == list(keys) or time.monotonic() > deadline:
            return state


@pytest.mark.timeout(SITE_TIMEOUT)
@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs Debian's chromium at {CHROMIUM}")
def test_the_explorer_redraws_the_simulators_run_when_a_control_changes(served: str) -> None:
    from _cdp import Chromium

    from gpipe.schedule import SCHEDULES
    from tests.docs.test_explorer import unpack

    out = ROOT / "docs" / "img" / "generated"
    names = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "dualpipe-v", "searched")
    packs = {name: unpack(out / f"explorer-{name}.js") for name in names}

    def run(name: str, key: str) -> dict[str, Any]:
        return packs[name]["runs"][key]

    def check(browser: Any, *drawn: tuple[str, str]) -> dict[str, Any]:
        """The page drew the exported run ``key`` of each ``(name, key)`` in its panel: every task (and copy) a bar,
        its numbers, both on one time axis."""
        state = _drawn(browser, *(f"{name}|{key}" for name, key in drawn))
        longest = max(run(name, key)["t"] for name, key in drawn)
        for panel, (name, key) in zip(state["panels"], drawn, strict=False):
            parts = key.split("|")
            shape, r = packs[name]["shapes"]["|".join(parts[:4])], run(name, key)
            order = shape["orders"][r.get("o", 0)]
            bars = sum(len(t.split()) for t in order["tasks"])
            bars += sum(len(c.split()) for c in order["copies"]) if parts[6] != "0.0" else 0
            assert panel["key"] == f"{name}|{key}" and panel["shown"]
            assert panel["spans"] == bars and panel["lines"] == len(r["k"])
            assert f"{name}: makespan {r['t'] / 480:g} ms, bubble {100 * r['b']:.1f}%, {shape['stages']} " \
                   "stages" in panel["summary"], panel["summary"]  # a forward is 1 ms (Note [units])
            assert panel["units"] == ["time (ms)", "time (ms)"]  # the Gantt chart's axis and the memory chart's
            devices = len(r["k"])  # a line per device, each its own colour (up to eight), as the legend shows
            assert len(set(panel["strokes"])) == devices and panel["legend"] == panel["strokes"]
            assert panel["scale"] == pytest.approx((760 - 60) / longest)
        assert state["panels"][1]["shown"] == (len(drawn) == 2)
        return state

    with Chromium(CHROMIUM) as browser:
        report = browser.load(served + "explorer/")
        assert not report.errors, report.errors
        state = check(browser, ("gpipe", "4|1|8|never|2.0|-|0.0|1.0|0.0"))
        assert "Equal to the simulation" in state["panels"][0]["form"]  # the closed form, where it holds
        assert browser.evaluate(_set("schedule", "1f1b")) == "1f1b"
        assert check(browser, ("1f1b", "4|1|8|never|2.0|-|0.0|1.0|0.0"))["weight"]  # no W in 1f1b: W's share is off
        assert run("1f1b", "4|1|8|never|2.0|-|0.0|1.0|0.0")["k"] != run("gpipe", "4|1|8|never|2.0|-|0.0|1.0|0.0")["k"]
        browser.evaluate(_set("schedule", "interleaved-1f1b"))
        browser.evaluate(_set("v", "2"))  # two stages per device: eight stages, a smaller bubble
        check(browser, ("interleaved-1f1b", "4|2|8|never|2.0|-|0.0|1.0|0.0"))
        browser.evaluate(_set("copy", "0.25"))  # copies appear on the copy rows, and leave the closed form
        form = check(browser, ("interleaved-1f1b", "4|2|8|never|2.0|-|0.25|1.0|0.0"))["panels"][0]["form"]
        assert "makespan and bubble differ from the simulation: copies take time" in form, form
        browser.evaluate(_set("m", "6"))  # not a multiple of p: a last partial round
        check(browser, ("interleaved-1f1b", "4|2|6|never|2.0|-|0.25|1.0|0.0"))
        browser.evaluate(_set("schedule", "dualpipe-v"))  # m < n = 8: the generator refuses, the page says why
        refused = _drawn(browser, "refused")["panels"][0]
        assert refused["spans"] == 0
        assert refused["summary"] == "dualpipe-v refused: " + packs["dualpipe-v"]["shapes"]["4|2|6|never"]
        browser.evaluate(_set("m", "8"))  # its overlapped pairs: both tasks drawn, each in half of the row
        pairs = len(SCHEDULES["dualpipe-v"](8, 8, "never", devices=4).pairs)
        assert pairs and check(browser, ("dualpipe-v", "4|2|8|never|2.0|0.5|0.25|1.0|0.0"))["panels"][0]["paired"] \
            == 2 * pairs
        browser.evaluate(_set("m", "6"))
        browser.evaluate(_set("schedule", "zb-h1"))
        browser.evaluate(_set("v", "1"))
        assert not check(browser, ("zb-h1", "4|1|6|never|2.0|0.5|0.25|1.0|0.0"))["weight"]
        browser.evaluate(_set("weight", "0.75"))  # more of the backward in W: another run, another makespan
        check(browser, ("zb-h1", "4|1|6|never|2.0|0.75|0.25|1.0|0.0"))
        assert run("zb-h1", "4|1|6|never|2.0|0.75|0.25|1.0|0.0")["t"] != \
            run("zb-h1", "4|1|6|never|2.0|0.5|0.25|1.0|0.0")["t"]
        # two schedules on one time axis, then heavier end stages, then the search beside ZB-H1
        browser.evaluate(_set("weight", "0.5"))
        browser.evaluate(_set("m", "8"))
        browser.evaluate(_set("compare", "1f1b"))
        check(browser, ("zb-h1", "4|1|8|never|2.0|0.5|0.25|1.0|0.0"), ("1f1b", "4|1|8|never|2.0|-|0.25|1.0|0.0"))
        browser.evaluate(_set("ends", "2.0"))
        state = check(browser, ("zb-h1", "4|1|8|never|2.0|0.5|0.25|2.0|0.0"),
                      ("1f1b", "4|1|8|never|2.0|-|0.25|2.0|0.0"))
        assert "the first and last stages cost more" in state["panels"][1]["form"]
        assert run("1f1b", "4|1|8|never|2.0|-|0.25|2.0|0.0")["t"] > run("1f1b", "4|1|8|never|2.0|-|0.25|1.0|0.0")["t"]
        browser.evaluate(_set("compare", "searched"))
        state = check(browser, ("zb-h1", "4|1|8|never|2.0|0.5|0.25|2.0|0.0"),
                      ("searched", "4|1|8|never|2.0|0.5|0.25|2.0|0.0"))
        lower = run("searched", "4|1|8|never|2.0|0.5|0.25|2.0|0.0")["l"] / 480
        assert f"the search's lower bound {lower:g} ms" in state["panels"][1]["summary"]
        browser.evaluate(_set("checkpoint", "always"))  # heavier ends ran with checkpoint never only: said so
        state = _drawn(browser, "unsimulated", "refused")
        assert state["panels"][0]["summary"].startswith("zb-h1 not simulated here: the explorer ran first and last")
        browser.evaluate(_set("compare", "none"))
        assert not _drawn(browser, "unsimulated")["panels"][1]["shown"]
        assert not browser.load(served + "explorer/").errors
