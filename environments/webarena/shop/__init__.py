"""A small shop of our own for WebArena-style tasks on 127.0.0.1: search, categories, product pages with reviews,
cart, checkout, order history, customer login, and the REST calls WebArena's evaluators use.

    python -m environments.webarena.shop --port 7770      # then: export SHOPPING=http://127.0.0.1:7770

Its task configs (tasks/*.json, WebArena's format, ids 812 and up) cover string_match, url_match and
program_html; `solutions.py` holds a scripted solution of each, used by tests and benches.

| module | what it is |
|---|---|
| `server` | the shop's HTTP server on loopback: sessions and login cookies, shared orders, the REST calls |
| `pages` | the HTML of its pages, with the paths and form fields of WebArena's Magento store |
| `catalog` | its fixed data: products, categories, accounts and the seeded order history |
| `solutions` | a scripted solution of each shop task, played through the real observation and actions |
"""
from __future__ import annotations

from pathlib import Path

from environments.webarena.shop.server import ShopServer

TASK_DIR = Path(__file__).parent / "tasks"


def start_shop(port: int = 0) -> ShopServer:
    """Serve the shop on 127.0.0.1:`port` (0: any free port) from a background thread; `close()` stops it."""
    return ShopServer(port).start()


__all__ = ["ShopServer", "start_shop", "TASK_DIR"]
