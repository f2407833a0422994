"""Hostile HTTP clients against the AgentGym env server (1,000 seeded requests) and the local shop: every
client error is a 4xx with an error body, nothing is a 500 or a dropped connection, the env count stays under
--max-envs, and the servers keep serving."""
from __future__ import annotations

import http.client
import json
import random
import socket
import time
import urllib.parse

from configs.env import EnvConfig
from environments.agentgym_http import make_server
from environments.agentgym_http.server import MAX_BODY_BYTES, ServerThread
from environments.webarena.shop.server import ShopServer
from tests.fuzz_inputs import HUGE_INTS

PATHS = ["/create", "/reset", "/step", "/close", "/observation", "/", "/nope"]


def _bodies(rng: random.Random, live: list[int]) -> bytes:
    env_id = rng.choice(live) if live and rng.random() < 0.6 else rng.choice(HUGE_INTS + [-1, 0, 10**6])
    kind = rng.randrange(14)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 200))  # mostly not UTF-8
    if kind == 1:
        return b"[" * 50_000 + b"]" * 50_000  # a nesting bomb
    if kind == 2:
        return json.dumps({"id": env_id, "data_idx": rng.choice(HUGE_INTS + [-5, 1.5, "3", None, True])}).encode()
    if kind == 3:
        return b'{"id": 1e999, "action": "go"}'
    if kind == 4:
        return b'{"id": ' + b"9" * 5000 + b"}"  # an integer of 5,000 digits
    if kind == 5:
        return json.dumps({"id": env_id, "action": rng.choice([None, 5, ["a"], {"b": 1}, "x" * 5000])}).encode()
    if kind == 6:
        return json.dumps(rng.choice([[1, 2], "s", 3, None])).encode()
    if kind == 7:
        return b"{" + b'"a":{' * 40 + b"}" * 41  # nested beyond the server's depth limit
    if kind == 8:
        return json.dumps({"id": rng.choice([True, False, "abc", "12a", [1], "\u00b2", "\u0661", "1" * 19])}).encode()
    if kind == 9:
        return b""
    return json.dumps({"id": env_id, "data_idx": rng.randrange(0, 40), "action": "turn left"}).encode()


def _request(conn: http.client.HTTPConnection, method: str, path: str, body: bytes = b"",
             headers: dict | None = None) -> tuple[int, bytes]:
    conn.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, resp.read()


def test_env_server_answers_1000_hostile_requests_with_4xx_and_keeps_serving():
    server = make_server("babyai", EnvConfig(), max_envs=6)
    rng = random.Random(4242)
    statuses: dict[int, int] = {}
    with ServerThread(server) as thread:
        conn = http.client.HTTPConnection(thread.host, thread.port, timeout=30)
        live: list[int] = []
        for i in range(1000):
            path = rng.choice(PATHS)
            if path == "/observation":
                status, body = _request(conn, "GET", f"/observation?id={rng.choice(['x', '-1', '1e9', '0'])}")
            elif path == "/create" and rng.random() < 0.5:
                status, body = _request(conn, "POST", "/create", b"{}")
                if status == 200:
                    live.append(json.loads(body)["id"])
            elif rng.random() < 0.02:
                status, body = _request(conn, "POST", path or "/step", b"x" * (MAX_BODY_BYTES + 10))
                conn.close()  # aiohttp closes a connection whose body it did not read
                conn = http.client.HTTPConnection(thread.host, thread.port, timeout=30)
            else:
                status, body = _request(conn, "POST", path, _bodies(rng, live))
            statuses[status] = statuses.get(status, 0) + 1
            assert status < 500, (i, path, status, body[:200])
            if status >= 400 and path not in ("/nope", "/"):
                assert "error" in json.loads(body), (i, body[:200])
            assert len(server._envs) <= server.max_envs
        assert statuses.get(429, 0) > 0 and statuses.get(400, 0) > 300 and statuses.get(413, 0) > 0, statuses
        for env_id in list(server._envs):  # still serving: close what is open, then a whole valid exchange
            assert _request(conn, "POST", "/close", json.dumps({"id": env_id}).encode())[0] == 200
        status, body = _request(conn, "POST", "/create", b"{}")
        env_id = json.loads(body)["id"]
        assert _request(conn, "POST", "/reset", json.dumps({"id": env_id, "data_idx": 0}).encode())[0] == 200
        assert _request(conn, "POST", "/step", json.dumps({"id": env_id, "action": "turn left"}).encode())[0] == 200
        conn.close()


# Strings str.isdigit() takes that are no ASCII id: a superscript two (int() raises), an Arabic-Indic one and
# a fullwidth one (int() reads both as 1), a digit string past the 18 allowed, an empty string, a sign.
NON_ASCII_IDS = ["\u00b2", "\u0661", "\uff11", "1" * 19, "", "+1", " 1", "1\n"]


def test_env_server_answers_400_for_every_id_that_is_not_ascii_digits():
    server = make_server("babyai", EnvConfig(), max_envs=4)
    with ServerThread(server) as thread:
        conn = http.client.HTTPConnection(thread.host, thread.port, timeout=30)
        for _ in range(2):  # ids 0 and 1 exist, so a "1" read from other digits would reach a live env
            assert _request(conn, "POST", "/create", b"{}")[0] == 200
        assert _request(conn, "POST", "/reset", json.dumps({"id": "1", "data_idx": 0}).encode())[0] == 200
        for bad in NON_ASCII_IDS:
            for path, body in (("/reset", {"id": bad, "data_idx": 0}), ("/step", {"id": bad, "action": "turn left"}),
                               ("/close", {"id": bad})):
                status, reply = _request(conn, "POST", path, json.dumps(body).encode())
                assert status == 400 and "not an integer" in json.loads(reply)["error"], (bad, path, status, reply)
            status, reply = _request(conn, "GET", "/observation?id=" + urllib.parse.quote(bad))
            assert status == 400, (bad, status, reply)
        assert sorted(server._envs) == [0, 1]  # nothing was closed through a look-alike id
        conn.close()


def _raw(url_port: int, data: bytes, timeout: float = 5.0) -> tuple[int, float]:
    """Send raw bytes to the shop; (status, seconds to the answer)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", url_port), timeout=timeout) as sock:
        sock.sendall(data)
        head = sock.recv(4096).decode("latin-1")
    return int(head.split()[1]), time.monotonic() - started


def test_shop_answers_malformed_requests_with_4xx_and_never_blocks_on_a_bad_length():
    shop = ShopServer().start()
    port = shop.server_address[1]
    try:
        cases = [
            (b"POST /rest/V1/carts HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400),
            (b"POST /checkout/ HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
            (b"POST /checkout/ HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n", 413),
            (b"POST /checkout/ HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n\xff\xfe\xfd\xfc", 400),
            (b"POST /rest/V1/x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n"
             b"[1,2]", 400),
            (b"POST /rest/V1/x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 3\r\n\r\n"
             b"{{{", 400),
            (b"GET / HTTP/1.1\r\nHost: x\r\nCookie: \x00\x01;;==\"\r\n\r\n", None),  # any 2xx-4xx, no crash
            (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),  # a request line past the limit
        ]
        for data, want in cases:
            status, seconds = _raw(port, data)
            assert seconds < 2.0, (data[:40], seconds)
            assert (status == want) if want else status < 500, (data[:60], status)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # and it still serves
        assert _request(conn, "GET", "/", headers={})[0] == 200
        conn.close()
    finally:
        shop.close()
