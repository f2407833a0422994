"""The local shop: a small store (search, categories, product pages, cart, checkout, orders, login) on 127.0.0.1.

What must hold:
- It listens on loopback only. It serves tests, benches and users (`python -m environments.webarena.shop`).
- Browsing state is per browser: the cart and the newsletter choice live in a `shop_session` cookie's server-side
  session, so every browser context (one per env) starts with an empty cart. Login is a separate signed
  `shop_login` cookie, so a saved storage state logs a fresh context in without sharing its cart.
- Orders are shared, as in the real store: the customer's history starts with the seeded orders, new orders are
  appended, and the REST endpoints WebArena's evaluators call return them (admin token, latest order, reviews).
- `reset()` restores the seeded state (orders, sessions).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from environments.webarena.shop import catalog, pages
from environments.webarena.shop.catalog import ADMIN, BY_ID, BY_SKU, BY_SLUG, CUSTOMER, PRODUCTS, SEED_ORDERS

LOOPBACK = "127.0.0.1"


class ShopState:
    def __init__(self):
        self.lock = threading.Lock()
        self.secret = secrets.token_bytes(16)
        self.admin_token = secrets.token_hex(16)
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.sessions: dict[str, dict] = {}
            self.orders: list[dict] = [{"id": oid, "lines": list(lines), "status": status}
                                       for oid, lines, status in SEED_ORDERS]

    def sign(self, email: str) -> str:
        mac = hmac.new(self.secret, email.encode(), hashlib.sha256).hexdigest()[:32]
        return f"{email}|{mac}"

    def verify(self, cookie: str | None) -> str | None:
        if not cookie or "|" not in cookie:
            return None
        email = cookie.rsplit("|", 1)[0]
        return email if hmac.compare_digest(self.sign(email), cookie) else None


def order_total(order: dict) -> float:
    return sum(BY_ID[pid].price * qty for pid, qty in order["lines"])


MAX_BODY_BYTES = 1 << 20


class ClientError(Exception):
    """A malformed request: answered with `status` (4xx), never with a traceback or a dropped connection."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ShopHandler(BaseHTTPRequestHandler):
    server: "ShopServer"
    protocol_version = "HTTP/1.1"
    timeout = 15  # seconds a connection may stay silent mid-request: a body shorter than declared frees its thread

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        return None  # quiet: tests and benches make thousands of requests

    # ---- plumbing -------------------------------------------------------------------------------------------
    def _cookies(self) -> SimpleCookie:
        try:
            return SimpleCookie(self.headers.get("Cookie", ""))
        except CookieError:
            raise ClientError(HTTPStatus.BAD_REQUEST, "malformed Cookie header") from None

    def _session(self) -> dict:
        """This browser's session, created (and its cookie queued on the response) on its first request."""
        if self._current is not None:
            return self._current
        state = self.server.state
        morsel = self._cookies().get("shop_session")
        with state.lock:
            if morsel is not None and morsel.value in state.sessions:
                self._current = state.sessions[morsel.value]
            else:
                token = secrets.token_hex(16)
                self._current = state.sessions[token] = {"cart": {}, "subscribed": False, "flash": ""}
                self._new_cookies.append(f"shop_session={token}; Path=/; HttpOnly; SameSite=Lax")
        return self._current

    def _begin(self) -> None:
        # One handler serves every request of a keep-alive connection: per-request fields start here.
        self._current: dict | None = None
        self._new_cookies: list[str] = []

    def _user(self) -> str | None:
        morsel = self._cookies().get("shop_login")
        return self.server.state.verify(morsel.value if morsel else None)

    def _send(self, status: int, body: bytes, content_type: str, headers: list[tuple[str, str]] = ()) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in list(headers) + [("Set-Cookie", c) for c in self._new_cookies]:
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _page(self, title_body: tuple[str, str], *, status: int = 200, error: str = "", query: str = "") -> None:
        session = self._session()
        flash, session["flash"] = session["flash"], ""
        user = self._user()
        name = CUSTOMER["name"] if user == CUSTOMER["email"] else user
        title, body = title_body
        html = pages.layout(title, body, user=name, cart_count=sum(session["cart"].values()), query=query,
                            message=flash, error=error)
        self._send(status, html.encode(), "text/html; charset=utf-8")

    def _redirect(self, location: str, cookies: list[str] = ()) -> None:
        headers = [("Location", location)] + [("Set-Cookie", c) for c in cookies]
        self._send(HTTPStatus.FOUND, b"", "text/plain", headers)

    def _form(self) -> dict[str, str]:
        declared = (self.headers.get("Content-Length") or "0").strip()
        if not declared.isdigit() or len(declared) > 12:
            raise ClientError(HTTPStatus.BAD_REQUEST, "Content-Length must be a non-negative integer")
        length = int(declared)
        if length > MAX_BODY_BYTES:
            raise ClientError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"bodies are limited to {MAX_BODY_BYTES} bytes")
        body = self.rfile.read(length) if length else b""
        if len(body) < length:
            raise ClientError(HTTPStatus.BAD_REQUEST, "the body is shorter than its Content-Length")
        try:
            raw = body.decode()
        except UnicodeDecodeError:
            raise ClientError(HTTPStatus.BAD_REQUEST, "the body is not UTF-8") from None
        if "json" in (self.headers.get("Content-Type") or ""):
            try:
                data = json.loads(raw or "{}")
            except (ValueError, RecursionError):
                raise ClientError(HTTPStatus.BAD_REQUEST, "the body is not valid JSON") from None
            if not isinstance(data, dict):
                raise ClientError(HTTPStatus.BAD_REQUEST, "the JSON body must be an object")
            return {str(k): str(v) for k, v in data.items()}
        return {k: v[-1] for k, v in parse_qs(raw).items()}

    def _guarded(self, handler) -> None:
        """Run one request; a malformed one gets its 4xx, and the connection is closed after it."""
        self._begin()
        try:
            handler()
        except ClientError as exc:
            self.close_connection = True
            self._new_cookies = []
            self._json(exc.status, {"message": str(exc)})
        except (ConnectionError, TimeoutError):  # the client went away or stalled mid-request
            self.close_connection = True

    def _not_found(self) -> None:
        self._page(("404 Not Found", "<h1>Whoops, our bad...</h1><p>The page you requested was not found.</p>"),
                   status=404)

    # ---- GET ------------------------------------------------------------------------------------------------
    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        self._guarded(self._get)

    def _get(self) -> None:
        url = urlparse(self.path)
        path = url.path if url.path.endswith((".html", "/")) else url.path + "/"
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        state = self.server.state
        user = self._user()
        if path == "/":
            return self._page(pages.home())
        if path == "/catalogsearch/result/":
            q = query.get("q", "")
            return self._page(pages.search_results(q, catalog.search(q)), query=q)
        if path.startswith("/category/"):
            name = pages.category_from_slug(path.split("/")[2])
            if name is None:
                return self._not_found()
            return self._page(pages.category(name, [p for p in PRODUCTS if p.category == name]))
        if path.endswith(".html") and path[1:-5] in BY_SLUG:
            return self._page(pages.product(BY_SLUG[path[1:-5]]))
        if path == "/checkout/cart/":
            session = self._session()
            return self._page(pages.cart([(BY_ID[pid], q) for pid, q in session["cart"].items()]))
        if path == "/customer/account/login/":
            return self._page(pages.login())
        if path == "/customer/account/logout/":
            return self._redirect("/", ["shop_login=; Path=/; Max-Age=0"])
        if path.startswith("/rest/"):
            return self._rest_get(url.path, query)
        # Everything below needs a signed-in customer.
        if user is None:
            return self._redirect("/customer/account/login/")
        if path == "/customer/account/":
            session = self._session()
            return self._page(pages.account(CUSTOMER["name"], user, session["subscribed"]))
        if path == "/checkout/":
            session = self._session()
            if not session["cart"]:
                return self._redirect("/checkout/cart/")
            return self._page(pages.checkout([(BY_ID[pid], q) for pid, q in session["cart"].items()],
                                             CUSTOMER["name"]))
        if path == "/checkout/onepage/success/":
            return self._page(pages.order_success(int(query.get("order", "0") or 0)))
        if path == "/sales/order/history/":
            with state.lock:
                rows = [(o["id"], order_total(o), o["status"]) for o in reversed(state.orders)]
            return self._page(pages.order_history(rows))
        if path.startswith("/sales/order/view/order_id/"):
            part = path.split("/")[5]
            with state.lock:
                order = next((o for o in state.orders if part.isdigit() and o["id"] == int(part)), None)
            if order is None:
                return self._not_found()
            return self._page(pages.order_view(order["id"], [(BY_ID[p], q) for p, q in order["lines"]],
                                               order["status"]))
        return self._not_found()

    # ---- POST -----------------------------------------------------------------------------------------------
    def do_POST(self) -> None:  # noqa: N802
        self._guarded(self._post)

    def _post(self) -> None:
        path = urlparse(self.path).path
        if path.startswith("/rest/"):
            return self._rest_post(path, self._form())
        form = self._form()
        state = self.server.state
        session = self._session()
        if path == "/customer/account/loginPost/":
            if form.get("login[username]") == CUSTOMER["email"] and form.get("login[password]") == CUSTOMER["password"]:
                cookie = f"shop_login={state.sign(CUSTOMER['email'])}; Path=/; HttpOnly; SameSite=Lax"
                return self._redirect("/customer/account/", [cookie])
            return self._page(pages.login(), error="The account sign-in was incorrect or your account is disabled "
                                                   "temporarily. Please wait and try again later.")
        if path == "/checkout/cart/add/":
            product = BY_ID.get(int(form.get("product", "0") or 0))
            qty = int(form.get("qty", "1") or 1)
            if product is None or not 1 <= qty <= 99:
                return self._redirect("/checkout/cart/")
            with state.lock:
                session["cart"][product.id] = session["cart"].get(product.id, 0) + qty
                session["flash"] = f"You added {product.name} to your shopping cart."
            return self._redirect(product.path)
        if path == "/checkout/cart/delete/":
            with state.lock:
                session["cart"].pop(int(form.get("product", "0") or 0), None)
            return self._redirect("/checkout/cart/")
        if self._user() is None:
            return self._redirect("/customer/account/login/")
        if path == "/checkout/placeOrder/":
            with state.lock:
                if not session["cart"]:
                    return self._redirect("/checkout/cart/")
                order_id = max(o["id"] for o in state.orders) + 1
                state.orders.append({"id": order_id, "lines": list(session["cart"].items()), "status": "Pending"})
                session["cart"] = {}
            return self._redirect(f"/checkout/onepage/success/?order={order_id}")
        if path == "/newsletter/manage/save/":
            with state.lock:
                session["subscribed"] = form.get("is_subscribed") == "1"
                session["flash"] = "We have saved your subscription."
            return self._redirect("/customer/account/")
        return self._not_found()

    # ---- REST (the calls WebArena's evaluation helpers make) ------------------------------------------------
    def _authorised(self) -> bool:
        return self.headers.get("Authorization", "") == f"Bearer {self.server.state.admin_token}"

    def _rest_post(self, path: str, body: dict[str, str]) -> None:
        if path == "/rest/default/V1/integration/admin/token":
            if body.get("username") == ADMIN["username"] and body.get("password") == ADMIN["password"]:
                return self._json(200, self.server.state.admin_token)
            return self._json(401, {"message": "The account sign-in was incorrect."})
        return self._json(404, {"message": "Request does not match any route."})

    def _rest_get(self, path: str, query: dict[str, str]) -> None:
        if not self._authorised():
            return self._json(401, {"message": "The consumer isn't authorized to access resources."})
        state = self.server.state
        if path.rstrip("/") == "/rest/V1/orders":
            descending = query.get("searchCriteria[sortOrders][0][direction]", "DESC").upper() == "DESC"
            size = int(query.get("searchCriteria[pageSize]", "0") or 0)
            with state.lock:
                orders = sorted(state.orders, key=lambda o: o["id"], reverse=descending)
                items = [{"increment_id": pages.order_number(o["id"]), "entity_id": o["id"], "status": o["status"],
                          "grand_total": order_total(o),
                          "items": [{"sku": BY_ID[p].sku, "name": BY_ID[p].name, "qty_ordered": q}
                                    for p, q in o["lines"]]} for o in orders]
            return self._json(200, {"items": items[:size] if size else items, "total_count": len(items)})
        parts = path.strip("/").split("/")
        if len(parts) == 5 and parts[:3] == ["rest", "V1", "products"] and parts[4] == "reviews":
            product = BY_SKU.get(parts[3])
            if product is None:
                return self._json(404, {"message": "The product that was requested doesn't exist."})
            reviews = [{"nickname": r.author, "detail": r.text,
                        "ratings": [{"rating_name": "Rating", "percent": r.rating * 20, "value": r.rating}]}
                       for r in product.reviews]
            return self._json(200, reviews)
        return self._json(404, {"message": "Request does not match any route."})


class ShopServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int = 0):
        super().__init__((LOOPBACK, port), ShopHandler)
        self.state = ShopState()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.server_address[1]}"

    def start(self) -> "ShopServer":
        self._thread = threading.Thread(target=self.serve_forever, name="local-shop", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def reset(self) -> None:
        self.state.reset()
