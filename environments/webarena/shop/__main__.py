"""`python -m environments.webarena.shop [--port 7770]`: serve the local shop until interrupted."""
from __future__ import annotations

import argparse
import sys

from environments.webarena.shop import start_shop


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m environments.webarena.shop", description=__doc__)
    parser.add_argument("--port", type=int, default=7770, help="port on 127.0.0.1 (default 7770)")
    args = parser.parse_args(argv)
    shop = start_shop(args.port)
    print(f"local shop at {shop.url}\n  export SHOPPING={shop.url}\n"
          f"task configs: environments/webarena/shop/tasks (item ids webarena_812 and up)", flush=True)
    try:
        shop._thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        shop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
