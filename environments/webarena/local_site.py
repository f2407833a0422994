"""Everything a test, bench or user needs to run WebArena episodes against the local shop, in one context manager.

    with local_site() as site:        # shop on 127.0.0.1, SHOPPING set, login state saved
        env = make_env(site.cfg)      # site.cfg: a WebArenaConfig for the shop's task configs
        ...

On exit the shop stops and the environment variables are restored. The saved login state is made by signing in
through the shop's login form over HTTP (no browser needed); `login.save_login_state` does the same through
Chromium, as for the real sites.
"""
from __future__ import annotations

import contextlib
import http.cookiejar
import json
import os
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from configs.env import WebArenaConfig
from environments.webarena.login import ACCOUNTS
from environments.webarena.shop import ShopServer, start_shop
from environments.webarena.tasks import local_task_dir


@dataclass
class LocalSite:
    shop: ShopServer
    cfg: WebArenaConfig

    @property
    def url(self) -> str:
        return self.shop.url


def write_shop_login_state(url: str, out_dir: Path) -> Path:
    """Sign in to the shop at `url` over HTTP and save the cookies as a Playwright storage state."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    user, password = ACCOUNTS["shopping"]
    form = urllib.parse.urlencode({"login[username]": user, "login[password]": password}).encode()
    opener.open(f"{url}/customer/account/loginPost/", data=form, timeout=30).read()
    cookies = [{"name": c.name, "value": c.value, "domain": c.domain, "path": c.path, "expires": -1,
                "httpOnly": True, "secure": False, "sameSite": "Lax"} for c in jar if c.name == "shop_login"]
    if not cookies:
        raise RuntimeError(f"signing in to the shop at {url} gave no login cookie")
    out = Path(out_dir) / "shopping_state.json"
    out.write_text(json.dumps({"cookies": cookies, "origins": []}))
    return out


@contextlib.contextmanager
def local_site(base: WebArenaConfig | None = None, port: int = 0) -> Iterator[LocalSite]:
    """Serve the shop, point SHOPPING at it, save its login state, and yield a config for its tasks."""
    shop = start_shop(port)
    saved = os.environ.get("SHOPPING")
    try:
        with tempfile.TemporaryDirectory(prefix="webarena-auth-") as auth_dir:
            os.environ["SHOPPING"] = shop.url
            write_shop_login_state(shop.url, Path(auth_dir))
            cfg = replace(base or WebArenaConfig(), task_dir=str(local_task_dir()), storage_state_dir=auth_dir)
            yield LocalSite(shop, cfg)
    finally:
        if saved is None:
            os.environ.pop("SHOPPING", None)
        else:
            os.environ["SHOPPING"] = saved
        shop.close()
