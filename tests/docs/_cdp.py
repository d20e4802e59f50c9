"""A tiny Chrome DevTools Protocol client: load pages in headless chromium, collect what a reader would see.

Used by ``test_site.py``. One browser process, one tab (a flattened target session over one websocket):
for each page it navigates, waits for the load event, and reports the console errors, failed requests,
images that did not load, the links on the page and the ids that anchors can point to. :meth:`Chromium.answer`
serves a URL from the test instead of the server (the request still counts as made).
"""

from __future__ import annotations

import base64
import html.parser
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin
from urllib.request import urlopen

import websocket  # websocket-client, in the dev extra

CHROMIUM = "/usr/bin/chromium"

#: The flags of a quiet, offline, throw-away headless browser.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-port=0",
)

_PAGE_REPORT_JS = """
JSON.stringify({
  images: Array.from(document.images).map(i => ({src: i.currentSrc || i.src, ok: i.complete && i.naturalWidth > 0})),
  links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
  ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id),
  title: document.title,
})
"""


@dataclass
class PageReport:
    """What loading one page showed."""

    url: str
    errors: list[str] = field(default_factory=list)
    broken_images: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    title: str = ""


class Chromium:
    """A headless chromium driven over the DevTools protocol; use as a context manager."""

    def __init__(self, executable: str = CHROMIUM, timeout: float = 30.0) -> None:
        self.executable = executable
        self.timeout = timeout
        self._profile = Path(tempfile.mkdtemp(prefix="gpipe-sim-chromium-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self._ws: websocket.WebSocket | None = None
        self._session = ""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self._answers: dict[str, bytes] = {}

    # -- lifecycle ---------------------------------------------------------------------------------------

    def __enter__(self) -> Chromium:
        self._proc = subprocess.Popen(
            [self.executable, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        port_file = self._profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while not (port_file.exists() and len(port_file.read_text().split()) >= 2):
            if self._proc.poll() is not None:
                raise RuntimeError(f"chromium exited with status {self._proc.returncode} before listening")
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not open its DevTools port")
            time.sleep(0.05)
        port, path = port_file.read_text().split()[:2]
        self._ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=self.timeout,
                                               suppress_origin=True)
        target = self._call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                   session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self._call(f"{domain}.enable")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._ws is not None:
                self._ws.close()
        finally:
            if self._proc is not None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            shutil.rmtree(self._profile, ignore_errors=True)

    # -- protocol ----------------------------------------------------------------------------------------

    def _send(self, method: str, params: dict[str, Any] | None, session: bool) -> int:
        assert self._ws is not None
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self._session
        self._ws.send(json.dumps(msg))
        return self._next_id

    def _receive(self, deadline: float) -> dict[str, Any] | None:
        assert self._ws is not None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        self._ws.settimeout(remaining)
        try:
            return json.loads(self._ws.recv())
        except websocket.WebSocketTimeoutException:
            return None

    def _call(self, method: str, params: dict[str, Any] | None = None, *, session: bool = True) -> dict[str, Any]:
        wanted = self._send(method, params, session)
        deadline = time.monotonic() + self.timeout
        while True:
            msg = self._receive(deadline)
            if msg is None:
                raise TimeoutError(f"no answer to {method}")
            if msg.get("id") == wanted:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self._event(msg)

    def _drain(self, seconds: float, until: str | None = None) -> bool:
        """Collect events for ``seconds``, or until an event named ``until`` arrives (then True)."""
        deadline = time.monotonic() + seconds
        while True:
            msg = self._receive(deadline)
            if msg is None:
                return False
            if "method" in msg:
                self._event(msg)
                if until is not None and msg["method"] == until:
                    return True

    def _event(self, msg: dict[str, Any]) -> None:
        """Keep an event for the page's report; answer a request paused for :meth:`answer` (the reply to that
        command arrives later, with an id nobody waits for)."""
        self._events.append(msg)
        if msg["method"] == "Fetch.requestPaused":
            p = msg["params"]
            body = self._answers.get(p["request"]["url"])
            if body is None:
                self._send("Fetch.continueRequest", {"requestId": p["requestId"]}, True)
            else:
                self._send("Fetch.fulfillRequest", {"requestId": p["requestId"], "responseCode": 200,
                                                    "responseHeaders": [{"name": "Content-Type",
                                                                         "value": "application/json"}],
                                                    "body": base64.b64encode(body).decode()}, True)

    def answer(self, url: str, body: bytes | None) -> None:
        """From now on, answer requests of exactly ``url`` with ``body`` (a 200 of JSON) instead of the server's
        response; ``None``: let the server answer again."""
        if body is None:
            self._answers.pop(url, None)
        else:
            self._answers[url] = body
        if self._answers:
            self._call("Fetch.enable", {"patterns": [{"urlPattern": u, "requestStage": "Request"}
                                                     for u in self._answers]})
        else:
            self._call("Fetch.disable")

    # -- pages -------------------------------------------------------------------------------------------

    def load(self, url: str, settle: float = 0.3) -> PageReport:
        """Navigate to ``url``, wait for its load event (and ``settle`` seconds more), report what happened."""
        self._events.clear()
        report = PageReport(url)
        result = self._call("Page.navigate", {"url": url})
        if result.get("errorText"):
            report.errors.append(f"navigation failed: {result['errorText']}")
            return report
        if not self._drain(self.timeout, until="Page.loadEventFired"):
            report.errors.append("no load event")
        self._drain(settle)
        for ev in self._events:
            report.errors.extend(_errors_of(ev))
        value = self._call("Runtime.evaluate", {"expression": _PAGE_REPORT_JS, "returnByValue": True})
        page = json.loads(value["result"]["value"])
        report.broken_images = [i["src"] for i in page["images"] if not i["ok"]]
        report.links = list(page["links"])
        report.ids = set(page["ids"])
        report.title = page["title"]
        return report


    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the current page (JSON-serialisable values only)."""
        result = self._call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised {result['exceptionDetails']}")
        return result["result"].get("value")


def _errors_of(event: dict[str, Any]) -> list[str]:
    method, p = event["method"], event.get("params", {})
    if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
        text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
        return [f"console.{p['type']}: {text}"]
    if method == "Runtime.exceptionThrown":
        d = p.get("exceptionDetails", {})
        return [f"uncaught exception: {d.get('exception', {}).get('description') or d.get('text')}"]
    if method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
        e = p["entry"]
        return [f"console ({e.get('source')}): {e.get('text')} {e.get('url', '')}".rstrip()]
    if method == "Network.loadingFailed" and not p.get("canceled"):
        return [f"request failed: {p.get('errorText')} (request {p.get('requestId')})"]
    if method == "Network.responseReceived":
        r = p.get("response", {})
        if int(r.get("status", 200)) >= 400:
            return [f"HTTP {r.get('status')} for {r.get('url')}"]
    return []


class _Collect(html.parser.HTMLParser):
    """The links, image sources, ids and title of an HTML page, as its markup holds them."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.images: list[str] = []
        self.ids: set[str] = set()
        self.title, self._in_title = "", False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if tag == "a" and a.get("href") is not None:
            self.links.append(str(a["href"]))
        elif tag == "img" and a.get("src"):
            self.images.append(str(a["src"]))
        self._in_title = tag == "title"

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False


def read(url: str, timeout: float = 10.0) -> PageReport:
    """What :meth:`Chromium.load` reports of a page, read from its HTML without a browser: its links (absolute),
    ids and title, and the images whose URL does not answer 200. No script runs, so no console error is seen: for
    pages made from one template, whose scripts a browser has run on a sibling."""
    report = PageReport(url)
    with urlopen(url, timeout=timeout) as response:
        page = _Collect()
        page.feed(response.read().decode("utf-8"))
    report.links = [urljoin(url, href) for href in page.links]
    report.ids, report.title = page.ids, page.title
    for src in page.images:
        try:
            with urlopen(urljoin(url, src), timeout=timeout) as image:
                ok = image.status == 200 and len(image.read()) > 0
        except OSError:
            ok = False
        if not ok:
            report.broken_images.append(urljoin(url, src))
    return report
