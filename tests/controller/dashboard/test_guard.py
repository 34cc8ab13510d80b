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
    login_url,
    root,
    same,
    session,
)

SECRET = "s3cret-token"
PORT = 8765
GUARD = Guard(secret=SECRET, port=PORT, hosts=allowed_hosts("127.0.0.1", PORT))
ROOT = root(SECRET)
COOKIE = {cookie_name(PORT): session(SECRET)}
HOST = {"host": "127.0.0.1:8765"}
POST_OK = {**HOST, "origin": "http://127.0.0.1:8765", CSRF_HEADER: csrf_token(SECRET)}


@pytest.mark.parametrize(("request_", "expected"), [
    # the cookie is the key
    (Request(method="GET", path=ROOT + "/", headers=HOST, cookies=COOKIE), Allow()),
    (Request(method="GET", path=ROOT + "/", headers=HOST), "not signed in"),
    (Request(method="GET", path=ROOT + "/", headers=HOST, cookies={cookie_name(PORT): "guess"}), "not signed in"),
    (Request(method="GET", path=ROOT + "/", headers=HOST, cookies={cookie_name(9999): session(SECRET)}), "not signed in"),
    # the token logs in and leaves the URL, keeping the rest of the query
    (Request(method="GET", path=ROOT + "/", query=f"token={SECRET}", headers=HOST), Login(location=ROOT + "/")),
    (Request(method="GET", path=ROOT + "/thread/t1", query=f"page=2&token={SECRET}", headers=HOST),
     Login(location=ROOT + "/thread/t1?page=2")),
    (Request(method="GET", path=ROOT + "/thread/a?b", raw_path=ROOT + "/thread/a%3Fb", query=f"token={SECRET}",
             headers=HOST), Login(location=ROOT + "/thread/a%3Fb")),
    # the secret itself is no cookie: the session derived from it is
    (Request(method="GET", path=ROOT + "/", headers=HOST, cookies={cookie_name(PORT): SECRET}), "not signed in"),
    (Request(method="GET", path=ROOT + "/", query="token=wrong", headers=HOST), "wrong token"),
    # Host: DNS rebinding
    (Request(method="GET", path=ROOT + "/", headers={"host": "evil.example:8765"}, cookies=COOKIE), "Host"),
    (Request(method="GET", path=ROOT + "/", headers={"host": "127.0.0.1:9999"}, cookies=COOKIE), "Host"),
    (Request(method="GET", path=ROOT + "/", headers={}, cookies=COOKIE), "Host"),
    (Request(method="GET", path=ROOT + "/", headers={"host": "localhost:8765"}, cookies=COOKIE), Allow()),
    (Request(method="GET", path=ROOT + "/", headers={"host": "[::1]:8765"}, cookies=COOKIE), Allow()),
    # Origin: checked whenever sent, required on POST
    (Request(method="GET", path=ROOT + "/", headers={**HOST, "origin": "http://evil.example"}, cookies=COOKIE),
     "cross-origin"),
    (Request(method="GET", path=ROOT + "/", headers={**HOST, "origin": "http://127.0.0.1:8765"}, cookies=COOKIE), Allow()),
    (Request(method="POST", path=ROOT + "/action/steer", headers=POST_OK, cookies=COOKIE), Allow()),
    (Request(method="POST", path=ROOT + "/action/steer", headers={**POST_OK, "origin": "null"}, cookies=COOKIE),
     "cross-origin"),
    (Request(method="POST", path=ROOT + "/action/steer", headers={k: v for k, v in POST_OK.items() if k != "origin"},
             cookies=COOKIE), "must carry its Origin"),
    # CSRF on every POST
    (Request(method="POST", path=ROOT + "/action/steer", headers={k: v for k, v in POST_OK.items() if k != CSRF_HEADER},
             cookies=COOKIE), "CSRF"),
    (Request(method="POST", path=ROOT + "/action/steer", headers={**POST_OK, CSRF_HEADER: csrf_token("other")},
             cookies=COOKIE), "CSRF"),
    # a POST never logs in by token
    (Request(method="POST", path=ROOT + "/action/steer", query=f"token={SECRET}", headers=POST_OK), "not signed in"),
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


@pytest.mark.parametrize("path", ["/", "//evil.example/", "/d/", ROOT + "x", "/d/" + "A" * 22 + "/"])
def test_outside_the_root_a_404_naming_nothing(path):
    for query in ("", f"token={SECRET}"):
        assert GUARD.check(Request(method="GET", path=path, query=query, headers=HOST, cookies=COOKIE)) \
            == Refuse(status=404, reason="Not Found")


def test_login_url_and_tokens():
    assert login_url("127.0.0.1", 8765, "a b") == f"http://127.0.0.1:8765{root('a b')}/?token=a+b"
    assert login_url("::1", 1, "x") == f"http://[::1]:1{root('x')}/?token=x"
    assert root("k") == root("k") != root("j") and len(root("k")) == len("/d/") + 22  # 132 bits
    assert csrf_token("k") == csrf_token("k") != csrf_token("j") != session("j")
    assert same("a", "a") and not same("a", "b") and not same(None, "a")
