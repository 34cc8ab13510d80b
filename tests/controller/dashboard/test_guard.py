"""The dashboard's guard: which requests are served, which refused and why."""

from __future__ import annotations

import pytest

from tillerman.controller.dashboard.guard import (
    CSRF_HEADER,
    Allow,
    Guard,
    Login,
    Refuse,
    Request,
    allowed_hosts,
    cookie_name,
    csrf_token,
    is_loopback,
    login_url,
    same,
)

SECRET = "s3cret-token"
PORT = 8765
GUARD = Guard(secret=SECRET, port=PORT, hosts=allowed_hosts("127.0.0.1", PORT))
COOKIE = {cookie_name(PORT): SECRET}
HOST = {"host": "127.0.0.1:8765"}
POST_OK = {**HOST, "origin": "http://127.0.0.1:8765", CSRF_HEADER: csrf_token(SECRET)}


@pytest.mark.parametrize(("request_", "expected"), [
    # the cookie is the key
    (Request(method="GET", path="/", headers=HOST, cookies=COOKIE), Allow()),
    (Request(method="GET", path="/", headers=HOST), "not signed in"),
    (Request(method="GET", path="/", headers=HOST, cookies={cookie_name(PORT): "guess"}), "not signed in"),
    (Request(method="GET", path="/", headers=HOST, cookies={cookie_name(9999): SECRET}), "not signed in"),
    # the token logs in and leaves the URL, keeping the rest of the query
    (Request(method="GET", path="/", query=f"token={SECRET}", headers=HOST), Login(location="/")),
    (Request(method="GET", path="/thread/t1", query=f"page=2&token={SECRET}", headers=HOST),
     Login(location="/thread/t1?page=2")),
    (Request(method="GET", path="//evil.example/", query=f"token={SECRET}", headers=HOST),
     Login(location="/evil.example/")),
    (Request(method="GET", path="/", query="token=wrong", headers=HOST), "wrong token"),
    # Host: DNS rebinding
    (Request(method="GET", path="/", headers={"host": "evil.example:8765"}, cookies=COOKIE), "Host"),
    (Request(method="GET", path="/", headers={"host": "127.0.0.1:9999"}, cookies=COOKIE), "Host"),
    (Request(method="GET", path="/", headers={}, cookies=COOKIE), "Host"),
    (Request(method="GET", path="/", headers={"host": "localhost:8765"}, cookies=COOKIE), Allow()),
    (Request(method="GET", path="/", headers={"host": "[::1]:8765"}, cookies=COOKIE), Allow()),
    # Origin: checked whenever sent, required on POST
    (Request(method="GET", path="/", headers={**HOST, "origin": "http://evil.example"}, cookies=COOKIE),
     "cross-origin"),
    (Request(method="GET", path="/", headers={**HOST, "origin": "http://127.0.0.1:8765"}, cookies=COOKIE), Allow()),
    (Request(method="POST", path="/action/steer", headers=POST_OK, cookies=COOKIE), Allow()),
    (Request(method="POST", path="/action/steer", headers={**POST_OK, "origin": "null"}, cookies=COOKIE),
     "cross-origin"),
    (Request(method="POST", path="/action/steer", headers={k: v for k, v in POST_OK.items() if k != "origin"},
             cookies=COOKIE), "must carry its Origin"),
    # CSRF on every POST
    (Request(method="POST", path="/action/steer", headers={k: v for k, v in POST_OK.items() if k != CSRF_HEADER},
             cookies=COOKIE), "CSRF"),
    (Request(method="POST", path="/action/steer", headers={**POST_OK, CSRF_HEADER: csrf_token("other")},
             cookies=COOKIE), "CSRF"),
    # a POST never logs in by token
    (Request(method="POST", path="/action/steer", query=f"token={SECRET}", headers=POST_OK), "not signed in"),
])
def test_guard_decides(request_, expected):
    decision = GUARD.check(request_)
    if isinstance(expected, str):
        assert isinstance(decision, Refuse) and decision.status == 403 and expected in decision.reason
        assert "\n" not in decision.reason
    else:
        assert decision == expected


@pytest.mark.parametrize(("host", "names", "expected", "refused"), [
    ("127.0.0.1", (), {"127.0.0.1:80", "localhost:80", "[::1]:80"}, {"0.0.0.0:80"}),
    ("::1", (), {"[::1]:80", "localhost:80", "127.0.0.1:80"}, set()),
    ("0.0.0.0", ("box.tailnet.ts.net",), {"0.0.0.0:80", "box.tailnet.ts.net:80"}, {"localhost:80"}),
    ("192.168.1.5", (), {"192.168.1.5:80"}, {"127.0.0.1:80"}),
])
def test_allowed_hosts(host, names, expected, refused):
    hosts = allowed_hosts(host, 80, names)
    assert expected <= hosts and not refused & hosts


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.3.4.5", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("0.0.0.0", False), ("192.168.1.5", False), ("example.com", False), ("::", False),
])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_login_url_and_tokens():
    assert login_url("127.0.0.1", 8765, "a b") == "http://127.0.0.1:8765/?token=a+b"
    assert login_url("::1", 1, "x") == "http://[::1]:1/?token=x"
    assert csrf_token("k") == csrf_token("k") != csrf_token("k", "other") != csrf_token("j")
    assert same("a", "a") and not same("a", "b") and not same(None, "a")
