"""The local shop, served by the run itself when it trains WebArena with `env.webarena.tasks=local_shop`.

The shop runs in the driver on 127.0.0.1 from the start of the run to its end. SHOPPING is set in the driver's
environment before Ray starts, so the local Ray's workers (the env pools) inherit it; the login state the shop's
tasks start from is saved under `<output_dir>/webarena-auth/`. A run that joins an existing Ray cluster cannot
use it (its env pools may be on other machines, which cannot reach this one's loopback): it is refused at start.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

from configs.schema import RootConfig

log = logging.getLogger("agentgym.local_shop")


def needs_local_shop(cfg: RootConfig) -> bool:
    return "webarena" in cfg.env.mix and cfg.env.webarena.tasks == "local_shop"


class ServedShop:
    """The shop for one run: `start` before Ray, `close` after it."""

    def __init__(self, shop, saved_url: str | None):
        self.shop, self._saved_url = shop, saved_url

    @classmethod
    def start(cls, cfg: RootConfig, out: Path, joins_cluster: bool) -> tuple[RootConfig, "ServedShop | None"]:
        """Serve the shop when the config asks for it; returns the config pointing at its login state."""
        if not needs_local_shop(cfg):
            return cfg, None
        if joins_cluster:
            raise SystemExit("env.webarena.tasks=local_shop serves the shop from this process on 127.0.0.1, which "
                             "the env pools of an existing Ray cluster may not reach: run it with a local Ray "
                             "(no RAY_ADDRESS, ray.address empty), or serve the shop yourself and set SHOPPING")
        from environments.webarena.local_site import write_shop_login_state
        from environments.webarena.shop import start_shop

        shop = start_shop(0)
        served = cls(shop, os.environ.get("SHOPPING"))
        try:
            os.environ["SHOPPING"] = shop.url
            auth = out / "webarena-auth"
            auth.mkdir(parents=True, exist_ok=True)
            write_shop_login_state(shop.url, auth)
        except BaseException:
            served.close()
            raise
        log.info("serving the local shop at %s for the webarena tasks", shop.url)
        webarena = dataclasses.replace(cfg.env.webarena, storage_state_dir=str(auth))
        return dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, webarena=webarena)), served

    def close(self) -> None:
        if self._saved_url is None:
            os.environ.pop("SHOPPING", None)
        else:
            os.environ["SHOPPING"] = self._saved_url
        self.shop.close()
