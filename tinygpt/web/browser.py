"""A real browser's WebGPU, driven from Python: headless Chromium through playwright, the page
tinygpt/web/replay.html served from memory (no network, no server), and three calls into it:
describe (adapter, features, limits), compile (every module and pipeline of a trace, with the
compiler's messages) and replay (one submission, then the views the trace names).

Only the system's Chromium is used (playwright downloads nothing): TINYGPT_CHROMIUM, else
/usr/bin/chromium (Debian's `chromium` package).
"""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from ..core.errors import TinyGPTError

HERE = Path(__file__).resolve().parent
ORIGIN = "https://tinygpt.invalid"      # a secure origin (WebGPU needs one), answered by route() below
FLAGS = ["--headless=new", "--no-sandbox", "--enable-unsafe-webgpu", "--enable-features=Vulkan",
         "--use-angle=swiftshader", "--use-webgpu-adapter=swiftshader"]


class BrowserUnavailable(TinyGPTError):
    """No Chromium or no playwright here: what to install."""


def chromium_path() -> str:
    given = os.environ.get("TINYGPT_CHROMIUM")
    ok = lambda c: bool(c) and Path(c).is_file() and os.access(c, os.X_OK)
    if given:
        if not ok(given):
            raise BrowserUnavailable(f"TINYGPT_CHROMIUM={given} is not an executable file; "
                                     "point it at a Chromium executable, or unset it for /usr/bin/chromium")
        return given
    for cand in ("/usr/bin/chromium", shutil.which("chromium")):
        if ok(cand):
            return cand
    raise BrowserUnavailable("no Chromium here: install Debian's 'chromium' package (apt-get install chromium) "
                             "or set TINYGPT_CHROMIUM to a Chromium executable")


def flags() -> list:
    """Chromium's flags: WebGPU on, headless, and on a machine without a GPU Chrome's own CPU
    Vulkan (SwiftShader); TINYGPT_CHROMIUM_FLAGS replaces the adapter choice for a real GPU."""
    extra = os.environ.get("TINYGPT_CHROMIUM_FLAGS")
    return FLAGS[:3] + (extra.split() if extra is not None else FLAGS[3:])


class Page:
    """The replay page in a running browser."""

    def __init__(self, page):
        self._page = page

    def _call(self, fn: str, arg=None, timeout_s: float = 300):
        self._page.set_default_timeout(timeout_s * 1000)
        return self._page.evaluate(f"(a) => window.tinygpt.{fn}(a)", arg)

    def describe(self) -> dict:
        return self._call("describe")

    def compile(self, trace: dict) -> dict:
        return self._call("compile", trace)

    def replay(self, trace: dict, timeout_s: float = 300) -> dict:
        return self._call("replay", trace, timeout_s)


@contextmanager
def open_page(timeout_s: float = 120):
    """A headless Chromium showing the replay page, ready; closed on exit."""
    exe = chromium_path()
    try:
        from playwright.sync_api import Error as PlaywrightError, sync_playwright
    except ImportError as e:
        raise BrowserUnavailable(f"the playwright package is not installed ({e}); "
                                 "install it with: pip install 'tinygpt[browser]'") from e
    files = {f"{ORIGIN}/replay.html": ("text/html", (HERE / "replay.html").read_bytes()),
             f"{ORIGIN}/replay.js": ("text/javascript", (HERE / "replay.js").read_bytes())}

    def serve(route):
        ctype, body = files.get(route.request.url, ("text/plain", None))
        if body is None:
            route.fulfill(status=404, body="not part of tinygpt's page")
        else:
            route.fulfill(status=200, content_type=ctype, body=body)

    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=exe, args=flags(), timeout=timeout_s * 1000)
        except PlaywrightError as e:
            raise BrowserUnavailable(f"{exe} did not start: {str(e).splitlines()[0]}") from e
        try:
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.route(f"{ORIGIN}/**", serve)
            page.goto(f"{ORIGIN}/replay.html", timeout=timeout_s * 1000)
            page.wait_for_function("document.getElementById('status').textContent !== 'loading'",
                                   timeout=timeout_s * 1000)
            if errors:
                raise BrowserUnavailable(f"the replay page failed to load: {errors[0]}")
            yield Page(page)
        finally:
            browser.close()
