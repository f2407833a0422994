"""Saved login states: log in once through each site's login form and save the browser's storage state.

Tasks name their state as WebArena does (`./.auth/shopping_state.json`, `./.auth/gitlab.reddit_state.json`); the
env loads `<env.webarena.storage_state_dir>/<that file name>` into each new context, so episodes start logged in
without typing passwords. The forms and accounts are WebArena's published defaults for its sites; the local shop
uses the shopping site's form and account, so its state is made the same way.

    python -m environments.webarena.login shopping --out .auth          # uses $SHOPPING
    python -m environments.webarena.login gitlab reddit --out .auth     # writes gitlab.reddit_state.json
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from environments.webarena.browser import CHROMIUM_FLAGS, VIEWPORT

ACCOUNTS = {"shopping": ("emma.lopez@gmail.com", "Password.123"), "shopping_admin": ("admin", "admin1234"),
            "reddit": ("MarvelsGrantMan136", "test1234"), "gitlab": ("byteblaze", "hello1234")}
SITE_VARS = {"shopping": "SHOPPING", "shopping_admin": "SHOPPING_ADMIN", "reddit": "REDDIT", "gitlab": "GITLAB"}


async def _login(page, site: str, url: str) -> None:
    user, password = ACCOUNTS[site]
    if site == "shopping":
        await page.goto(f"{url}/customer/account/login/")
        await page.get_by_label("Email", exact=True).fill(user)
        await page.get_by_label("Password", exact=True).fill(password)
        await page.get_by_role("button", name="Sign In").click()
    elif site == "shopping_admin":
        await page.goto(url)
        await page.get_by_placeholder("user name").fill(user)
        await page.get_by_placeholder("password").fill(password)
        await page.get_by_role("button", name="Sign in").click()
    elif site == "reddit":
        await page.goto(f"{url}/login")
        await page.get_by_label("Username").fill(user)
        await page.get_by_label("Password").fill(password)
        await page.get_by_role("button", name="Log in").click()
    elif site == "gitlab":
        await page.goto(f"{url}/users/sign_in")
        await page.get_by_test_id("username-field").fill(user)
        await page.get_by_test_id("password-field").fill(password)
        await page.get_by_test_id("sign-in-button").click()
    else:
        raise ValueError(f"no login procedure for site {site!r}; known: {', '.join(ACCOUNTS)}")
    await page.wait_for_load_state("load")


async def save_login_state(sites: list[str], out_dir: str | Path, chromium_path: str = "/usr/bin/chromium",
                           urls: dict[str, str] | None = None) -> Path:
    """Log in to `sites` in one context and save `<out_dir>/<sites joined by '.'>_state.json`."""
    from playwright.async_api import async_playwright

    urls = dict(urls or {})
    for site in sites:
        if site not in urls:
            var = SITE_VARS.get(site, site.upper())
            if not os.environ.get(var):
                raise ValueError(f"logging in to {site} needs the {var} environment variable")
            urls[site] = os.environ[var].rstrip("/")
    out = Path(out_dir) / f"{'.'.join(sorted(sites))}_state.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium_path, headless=True, args=list(CHROMIUM_FLAGS))
        try:
            context = await browser.new_context(viewport=VIEWPORT)
            page = await context.new_page()
            for site in sorted(sites):
                await _login(page, site, urls[site])
            await context.storage_state(path=str(out))
        finally:
            await browser.close()
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m environments.webarena.login", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sites", nargs="+", choices=sorted(ACCOUNTS))
    parser.add_argument("--out", default=".auth", help="folder for the state file (env.webarena.storage_state_dir)")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args(argv)
    print(asyncio.run(save_login_state(args.sites, args.out, args.chromium)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
