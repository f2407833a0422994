"""HTML of the local shop's pages: plain semantic markup, so the accessibility tree reads like a real store.

Paths and form field names follow the Magento store that WebArena's shopping site runs (`/catalogsearch/result/`,
`/checkout/cart/`, `/customer/account/login/` with fields `login[username]` / `login[password]` and button
`#send2`, `/sales/order/view/order_id/<n>/`), so task configs and login code read the same on both.
"""
from __future__ import annotations

from html import escape
from urllib.parse import quote_plus

from environments.webarena.shop.catalog import CATEGORIES, PRODUCTS, Product, money

STORE_NAME = "One Stop Market"

_STYLE = """
body { font-family: sans-serif; margin: 0; font-size: 15px; }
header { background: #f4f4f4; padding: 8px 16px; display: flex; gap: 24px; align-items: center; flex-wrap: wrap; }
header .logo { font-size: 22px; font-weight: bold; }
main { padding: 12px 16px; }
.products { display: grid; grid-template-columns: repeat(4, 280px); gap: 10px; list-style: none; padding: 0; }
.products li { border: 1px solid #ddd; padding: 8px; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 4px 8px; text-align: left; }
.message { background: #e6f5e6; padding: 6px; } .error { background: #fbe3e3; padding: 6px; }
footer { padding: 12px 16px; color: #666; }
"""


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def layout(title: str, body: str, *, user: str | None, cart_count: int, query: str = "", message: str = "",
           error: str = "") -> str:
    account = ('<a href="/customer/account/">My Account</a> <a href="/sales/order/history/">My Orders</a> '
               '<a href="/customer/account/logout/">Sign Out</a>' if user else
               '<a href="/customer/account/login/">Sign In</a>')
    welcome = f"<span>Welcome, {_e(user)}!</span>" if user else "<span>Default welcome msg!</span>"
    categories = " ".join(f'<a href="/category/{_slug(c)}/">{_e(c)}</a>' for c in CATEGORIES)
    notes = (f'<p class="message" role="status">{_e(message)}</p>' if message else "") + (
        f'<p class="error" role="alert">{_e(error)}</p>' if error else "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title><style>{_STYLE}</style></head>
<body>
<header>
<a class="logo" href="/">{STORE_NAME}</a>
<form action="/catalogsearch/result/" method="get" role="search">
<input id="search" type="search" name="q" aria-label="Search" placeholder="Search entire store here..."
 value="{_e(query)}">
<button type="submit">Search</button>
</form>
<nav aria-label="Account">{welcome} {account} <a href="/checkout/cart/">My Cart ({cart_count})</a></nav>
<nav aria-label="Categories">{categories}</nav>
</header>
<main>
{notes}
{body}
</main>
<footer>Local test store of agentgym-rl.</footer>
</body></html>"""


def _slug(name: str) -> str:
    return name.lower().replace(" ", "-")


def category_from_slug(slug: str) -> str | None:
    return next((c for c in CATEGORIES if _slug(c) == slug), None)


def product_list(products: list[Product] | tuple[Product, ...]) -> str:
    if not products:
        return "<p>Your search returned no results.</p>"
    items = "".join(f'<li class="product-item"><a href="{p.path}">{_e(p.name)}</a> '
                    f'<span class="price">{money(p.price)}</span></li>' for p in products)
    return f'<ol class="products">{items}</ol>'


def home() -> tuple[str, str]:
    return "Home Page", f"<h1>Welcome to {STORE_NAME}</h1><h2>Our products</h2>{product_list(PRODUCTS[:8])}"


def search_results(query: str, found: list[Product]) -> tuple[str, str]:
    head = f"<h1>Search results for: '{_e(query)}'</h1><p>{len(found)} items</p>"
    return f"Search results for: '{query}'", head + product_list(found)


def category(name: str, products: list[Product]) -> tuple[str, str]:
    return name, f"<h1>{_e(name)}</h1><p>{len(products)} items</p>{product_list(products)}"


def product(p: Product) -> tuple[str, str]:
    reviews = "".join(f'<li class="review"><strong>{_e(r.author)}</strong> '
                      f'<span>Rating: {r.rating} out of 5</span><p>{_e(r.text)}</p></li>' for r in p.reviews)
    body = f"""<h1 class="page-title">{_e(p.name)}</h1>
<p class="sku">SKU: {_e(p.sku)}</p>
<p class="price">{money(p.price)}</p>
<p class="description">{_e(p.description)}</p>
<form action="/checkout/cart/add/" method="post" class="tocart">
<input type="hidden" name="product" value="{p.id}">
<label for="qty">Qty</label> <input id="qty" type="number" name="qty" value="1" min="1" max="99">
<button type="submit" id="product-addtocart-button">Add to Cart</button>
</form>
<section class="reviews"><h2>Reviews ({len(p.reviews)})</h2>
<ol>{reviews or '<li>No reviews yet.</li>'}</ol></section>"""
    return p.name, body


def cart(lines: list[tuple[Product, int]]) -> tuple[str, str]:
    if not lines:
        return "Shopping Cart", "<h1>Shopping Cart</h1><p>You have no items in your shopping cart.</p>"
    rows = "".join(f"""<tr class="item"><td><a href="{p.path}">{_e(p.name)}</a></td><td>{money(p.price)}</td>
<td>Qty: {q}</td><td>{money(p.price * q)}</td>
<td><form action="/checkout/cart/delete/" method="post"><input type="hidden" name="product" value="{p.id}">
<button type="submit" aria-label="Remove {_e(p.name)}">Remove</button></form></td></tr>""" for p, q in lines)
    total = sum(p.price * q for p, q in lines)
    body = f"""<h1>Shopping Cart</h1>
<table class="cart items"><thead><tr><th>Item</th><th>Price</th><th>Qty</th><th>Subtotal</th><th></th></tr></thead>
<tbody>{rows}</tbody></table>
<p class="grand totals">Order Total: {money(total)}</p>
<a href="/checkout/" class="checkout">Proceed to Checkout</a>"""
    return "Shopping Cart", body


def checkout(lines: list[tuple[Product, int]], customer: str) -> tuple[str, str]:
    items = "".join(f"<li>{_e(p.name)} &times; {q}</li>" for p, q in lines)
    total = sum(p.price * q for p, q in lines)
    body = f"""<h1>Checkout</h1>
<h2>Shipping Address</h2><address>{_e(customer)}<br>1 Market Street<br>Pittsburgh, PA 15213</address>
<h2>Order Summary</h2><ul>{items}</ul><p>Order Total: {money(total)}</p>
<form action="/checkout/placeOrder/" method="post"><button type="submit">Place Order</button></form>"""
    return "Checkout", body


def order_success(order_id: int) -> tuple[str, str]:
    number = order_number(order_id)
    body = (f"<h1>Thank you for your purchase!</h1><p>Your order number is: "
            f'<a href="/sales/order/view/order_id/{order_id}/">{number}</a>.</p>')
    return "Success Page", body


def order_number(order_id: int) -> str:
    return f"{order_id:09d}"


def order_view(order_id: int, lines: list[tuple[Product, int]], status: str) -> tuple[str, str]:
    rows = "".join(f"<tr><td>{_e(p.name)}</td><td>{_e(p.sku)}</td><td>{money(p.price)}</td><td>{q}</td>"
                   f"<td>{money(p.price * q)}</td></tr>" for p, q in lines)
    total = sum(p.price * q for p, q in lines)
    body = f"""<h1>Order # {order_number(order_id)}</h1><p class="order-status">{_e(status)}</p>
<div class="order-details-items ordered"><h2>Items Ordered</h2>
<table><thead><tr><th>Product Name</th><th>SKU</th><th>Price</th><th>Qty</th><th>Subtotal</th></tr></thead>
<tbody>{rows}</tbody></table><p>Grand Total: {money(total)}</p></div>"""
    return f"Order # {order_number(order_id)}", body


def order_history(orders: list[tuple[int, float, str]]) -> tuple[str, str]:
    rows = "".join(f"<tr><td>{order_number(o)}</td><td>{money(t)}</td><td>{_e(s)}</td>"
                   f'<td><a href="/sales/order/view/order_id/{o}/">View Order {order_number(o)}</a></td></tr>'
                   for o, t, s in orders)
    body = ("<h1>My Orders</h1><table class=\"orders-history\"><thead><tr><th>Order #</th><th>Order Total</th>"
            f"<th>Status</th><th>Action</th></tr></thead><tbody>{rows}</tbody></table>")
    return "My Orders", body


def account(name: str, email: str, subscribed: bool) -> tuple[str, str]:
    checked = " checked" if subscribed else ""
    body = f"""<h1>My Account</h1>
<section class="box-information"><h2>Contact Information</h2><p>{_e(name)}<br>{_e(email)}</p></section>
<section class="box-newsletter"><h2>Newsletters</h2>
<form action="/newsletter/manage/save/" method="post">
<input type="checkbox" id="subscription" name="is_subscribed" value="1" title="General Subscription"{checked}>
<label for="subscription">General Subscription</label>
<button type="submit">Save</button></form></section>"""
    return "My Account", body


def login(error: str = "") -> tuple[str, str]:
    body = """<h1>Customer Login</h1>
<form action="/customer/account/loginPost/" method="post" id="login-form">
<label for="email">Email</label> <input id="email" type="email" name="login[username]">
<label for="pass">Password</label> <input id="pass" type="password" name="login[password]">
<button type="submit" id="send2">Sign In</button></form>"""
    return "Customer Login", body


def search_link(query: str) -> str:
    return f"/catalogsearch/result/?q={quote_plus(query)}"
