"""The local shop's fixed data: products, categories, accounts and the seeded order history.

Everything here is constant, so task configs can state exact answers. The account names and passwords are
WebArena's published defaults for its shopping site, so the same login code serves both.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Review:
    author: str
    rating: int  # 1..5 stars
    text: str


@dataclass(frozen=True)
class Product:
    id: int
    sku: str
    name: str
    category: str
    price: float
    description: str
    reviews: tuple[Review, ...] = ()

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in self.name.lower()).strip("-").replace("--", "-")

    @property
    def path(self) -> str:
        return f"/{self.slug}.html"


CATEGORIES = ("Bags", "Yoga", "Water Bottles", "Tees", "Electronics")

PRODUCTS: tuple[Product, ...] = (
    Product(1, "24-MB01", "Joust Duffle Bag", "Bags", 34.00,
            "A sturdy duffle with a padded shoulder strap and a separate shoe compartment.",
            (Review("Rosalie", 5, "Fits everything for a weekend away."),
             Review("Tom K", 4, "Good bag, the strap could be wider."))),
    Product(2, "24-MB04", "Strive Shoulder Pack", "Bags", 32.00,
            "A compact shoulder pack for the gym or the office.",
            (Review("Ana", 3, "Smaller than I expected."),)),
    Product(3, "24-MB02", "Fusion Backpack", "Bags", 59.00,
            "A backpack with a laptop sleeve, two side pockets and ventilated back padding.",
            (Review("Jerome", 5, "My laptop and lunch both fit."),
             Review("Mei", 5, "Comfortable on long walks."),
             Review("Dario", 4, "Zippers are a bit stiff at first."))),
    Product(4, "24-MB06", "Rival Field Messenger", "Bags", 45.00,
            "A canvas messenger bag with a flap closure and a tablet pocket."),
    Product(5, "24-UG04", "Zing Jump Rope", "Yoga", 12.00,
            "A speed rope with foam handles and an adjustable cable.",
            (Review("Lee", 2, "The cable kinks easily."),)),
    Product(6, "24-UG06", "Affirm Water Bottle", "Water Bottles", 7.00,
            "A 20 oz plastic bottle with a flip straw.",
            (Review("Bea", 4, "Cheap and does the job."),)),
    Product(7, "24-UG07", "Dual Handle Cardio Ball", "Yoga", 12.00,
            "A weighted ball with two grip handles for cardio workouts."),
    Product(8, "24-UG01", "Quest Lumaflex Band", "Yoga", 19.00,
            "A resistance band loop for strength and stretching.",
            (Review("Kim", 5, "Great for physio exercises."), Review("Olu", 4, "Strong band."))),
    Product(9, "24-UG05", "Go-Get'r Pushup Grips", "Yoga", 19.00,
            "A pair of pushup grips that rotate to ease wrist strain."),
    Product(10, "24-UG02", "Pursuit Lumaflex Tone Band", "Yoga", 16.00,
            "A light tone band with handles, for toning workouts."),
    Product(11, "24-WG080", "Sprite Stasis Ball 65 cm", "Yoga", 27.00,
            "An anti-burst exercise ball, 65 cm across, with a hand pump.",
            (Review("Sam", 5, "Sturdy and easy to inflate."),)),
    Product(12, "24-WG084", "Sprite Foam Yoga Brick", "Yoga", 5.00,
            "A light foam brick to support yoga poses."),
    Product(13, "24-WG088", "Sprite Yoga Strap 6 foot", "Yoga", 14.00,
            "A cotton yoga strap with a metal D-ring buckle, 6 feet long."),
    Product(14, "24-WG083", "Harmony Yoga Mat", "Yoga", 38.00,
            "A 6 mm non-slip yoga mat with a carrying strap.",
            (Review("Ivy", 5, "Thick and grippy."), Review("Noor", 3, "Smells for a few days."))),
    Product(15, "24-UB02", "Hydro Steel Bottle", "Water Bottles", 21.00,
            "A vacuum-insulated steel bottle that keeps drinks cold for 24 hours.",
            (Review("Pat", 5, "Still cold after a day in the car."),)),
    Product(16, "24-UB03", "Summit Glass Bottle", "Water Bottles", 17.00,
            "A glass bottle with a silicone sleeve and a bamboo lid."),
    Product(17, "MS04-TEE", "Aero Daily Fitness Tee", "Tees", 24.00,
            "A quick-dry running tee with flatlock seams."),
    Product(18, "MS05-TEE", "Logan HeatTec Tee", "Tees", 24.00,
            "A lightweight tee that wicks sweat.",
            (Review("Chris", 4, "Runs a little large."),)),
    Product(19, "WS03-TEE", "Gabrielle Micro Sleeve Top", "Tees", 28.00,
            "A soft micro-sleeve top in a relaxed fit."),
    Product(20, "EL-0101", "Pulse Wireless Earbuds", "Electronics", 79.00,
            "Wireless earbuds with a charging case and 20 hours of battery life.",
            (Review("Jo", 2, "Left bud disconnects."), Review("Raj", 4, "Good sound for the price."),
             Review("Uma", 5, "Great for running."))),
    Product(21, "EL-0102", "Stride Fitness Tracker", "Electronics", 49.00,
            "A fitness tracker with a heart-rate sensor and sleep tracking."),
    Product(22, "EL-0103", "Beacon Bike Light", "Electronics", 15.00,
            "A rechargeable front bike light with three modes."),
)

CUSTOMER = {"email": "emma.lopez@gmail.com", "password": "Password.123", "name": "Emma Lopez"}
ADMIN = {"username": "admin", "password": "admin1234"}

# The customer's order history before any task runs: (order id, [(product id, qty)], status).
SEED_ORDERS: tuple[tuple[int, tuple[tuple[int, int], ...], str], ...] = (
    (1, ((8, 1), (11, 1)), "Complete"),
    (2, ((1, 1), (14, 1), (6, 2)), "Complete"),
    (3, ((20, 1),), "Canceled"),
)

BY_ID = {p.id: p for p in PRODUCTS}
BY_SLUG = {p.slug: p for p in PRODUCTS}
BY_SKU = {p.sku: p for p in PRODUCTS}


def money(value: float) -> str:
    return f"${value:,.2f}"


def search(query: str) -> list[Product]:
    """Products whose name, category or description contains every query word (case-insensitive)."""
    words = query.lower().split()
    if not words:
        return []
    return [p for p in PRODUCTS if all(w in f"{p.name} {p.category} {p.description}".lower() for w in words)]
