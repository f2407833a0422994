"""One Chromium per env worker (per event loop), one browser context per env.

What must hold:
- Playwright's async API drives Debian's chromium (`executable_path`, `playwright install` cannot download here)
  with flags that keep it off the network it cannot reach (background networking, component updates, sync, QUIC).
- All envs of one event loop share one browser; each env owns a context (about 60 MB, against about 240 MB for
  a browser per env), so cookies, storage and tabs never leak between envs.
- A crashed browser is replaced: the envs whose contexts died raise on their next call (an env error, which the
  pool handles by replacing the env); the next `new_context()` launches a fresh browser and counts the restart.
- The browser is closed when the last env holding it releases it.
"""
from __future__ import annotations

import asyncio
import os
import weakref

CHROMIUM_FLAGS = ("--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--no-first-run", "--disable-quic", "--disable-dev-shm-usage", "--no-default-browser-check",
                  "--disable-features=Translate,OptimizationHints,MediaRouter")
VIEWPORT = {"width": 1280, "height": 720}


class BrowserHost:
    def __init__(self, chromium_path: str):
        self.chromium_path = chromium_path
        self.restarts = 0  # browsers replaced after a crash or disconnect
        self.launches = 0
        self.users = 0
        self._playwright = None
        self._browser = None
        self._lock = asyncio.Lock()

    @property
    def browser(self):
        return self._browser

    def connected(self) -> bool:
        return self._browser is not None and self._browser.is_connected()

    async def _ensure_browser(self):
        if self.connected():
            return self._browser
        if not os.path.exists(self.chromium_path):
            raise FileNotFoundError(f"env.webarena.chromium_path: no browser at {self.chromium_path} "
                                    "(Debian: apt-get install -y chromium; launch/install.sh does this)")
        if self._browser is not None:  # it was running and is gone: a crash or an external close
            self.restarts += 1
            await self._stop_playwright()
        from playwright.async_api import async_playwright

        self._playwright = await async_playwright().start()
        try:
            self._browser = await self._playwright.chromium.launch(
                executable_path=self.chromium_path, headless=True, args=list(CHROMIUM_FLAGS))
        except BaseException:
            await self._stop_playwright()
            raise
        self.launches += 1
        return self._browser

    async def new_context(self, storage_state: str | None = None, geolocation: dict | None = None):
        async with self._lock:
            browser = await self._ensure_browser()
            options = {"viewport": VIEWPORT, "storage_state": storage_state}
            if geolocation:
                options.update(geolocation=geolocation, permissions=["geolocation"])
            return await browser.new_context(**options)

    def acquire(self) -> None:
        self.users += 1

    async def release(self) -> None:
        self.users -= 1
        if self.users <= 0:
            self.users = 0
            async with self._lock:
                await self._stop_playwright()

    async def _stop_playwright(self) -> None:
        browser, playwright = self._browser, self._playwright
        self._browser = self._playwright = None
        try:
            if browser is not None and browser.is_connected():
                await browser.close()
        except Exception:  # noqa: BLE001 - a dead browser cannot be closed; the driver below takes it down
            pass
        if playwright is not None:
            try:
                await playwright.stop()
            except Exception:  # noqa: BLE001 - the driver may already be gone
                pass

    def browser_pid(self) -> int | None:
        """The browser's main process id (tests use it to crash the browser on purpose)."""
        import psutil

        for proc in psutil.Process().children(recursive=True):
            try:
                cmd = proc.cmdline()
            except psutil.Error:
                continue
            if cmd and os.path.basename(cmd[0]).startswith("chrom") and not any(a.startswith("--type=") for a in cmd):
                if self.chromium_path in cmd[0] or os.path.realpath(cmd[0]).startswith("/usr/lib/chromium"):
                    return proc.pid
        return None


_HOSTS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, BrowserHost]]" = weakref.WeakKeyDictionary()


def host_for(chromium_path: str) -> BrowserHost:
    """The running event loop's browser host for this chromium (one per loop: Playwright objects are loop-bound)."""
    loop = asyncio.get_running_loop()
    hosts = _HOSTS.setdefault(loop, {})
    if chromium_path not in hosts:
        hosts[chromium_path] = BrowserHost(chromium_path)
    return hosts[chromium_path]
