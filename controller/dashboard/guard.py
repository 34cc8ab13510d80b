"""Who may ask the dashboard: pure checks of a request's facts, no I/O.

The page runs on the owner's machine beside the ledger, and its actions write to it,
so every request must come from the owner's browser, to this server, by this name:

* the secret: a random token printed at start (as Jupyter does); a GET carrying it as
  ``?token=`` sets it as an HttpOnly, SameSite=Strict cookie and redirects to the same
  URL without it (so it leaves the address bar and the history). Every other request
  must carry the cookie.
* Host: one of the names the server was bound as (DNS rebinding: a page of another site
  whose name now resolves to 127.0.0.1 sends its own name as Host).
* Origin: when a request carries one it must be this server's; a POST must carry one.
* CSRF: every POST carries a token derived from the secret (an HMAC per purpose), in the
  header htmx sends from the page; a page of another origin cannot read it.

Every response carries a Content-Security-Policy that forbids inline script (all script
is a static file of ours), and headers that keep it out of caches and referrers.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, urlencode

import msgspec

CSRF_HEADER = "x-tillerman-csrf"
TOKEN_PARAM = "token"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
SAFE_METHODS = frozenset({"GET", "HEAD"})

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self';"
       " form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS: Mapping[str, str] = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
    "x-frame-options": "DENY",  # frame-ancestors for the browsers that predate it
}


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def same(given: str | None, expected: str) -> bool:
    """Constant-time: how much of a guess was right is not told by the time it took."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def csrf_token(secret: str, purpose: str = "action") -> str:
    """The token a POST for ``purpose`` carries: known to the page, which the server
    rendered, and to no other origin (it cannot read the page)."""
    return hmac.new(secret.encode(), b"tillerman-dashboard-csrf:" + purpose.encode(), hashlib.sha256).hexdigest()


def cookie_name(port: int) -> str:
    """Cookies are not kept apart by port: two dashboards on one machine each keep their own."""
    return f"tillerman_dashboard_{port}"


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_host(host: str) -> str:
    """``host`` as it stands in a URL: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def login_url(host: str, port: int, secret: str) -> str:
    return f"http://{url_host(host)}:{port}/?{urlencode({TOKEN_PARAM: secret})}"


def allowed_hosts(host: str, port: int, names: Iterable[str] = ()) -> frozenset[str]:
    """The ``Host`` values this server answers to: the bound address (with the loopback
    names when bound to loopback) and the names given with ``--allow-remote``, each with
    its port."""
    hosts = {url_host(host), *(url_host(name) for name in names)}
    if is_loopback(host):
        hosts.update(LOOPBACK_NAMES)
    return frozenset(f"{h}:{port}".lower() for h in hosts)


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """What the guard looks at: the method, the path with its query string, and the
    headers (names in lower case) and cookies as sent."""

    method: str
    path: str
    query: str = ""
    headers: Mapping[str, str] = {}
    cookies: Mapping[str, str] = {}


class Allow(msgspec.Struct, frozen=True):
    pass


class Login(msgspec.Struct, frozen=True, kw_only=True):
    """The right token in the URL: set the cookie, go to ``location`` (the URL without it)."""

    location: str


class Refuse(msgspec.Struct, frozen=True, kw_only=True):
    status: int  # 400: the request is malformed; 403: it is not allowed
    reason: str  # one line: why, and what to do


Decision = Allow | Login | Refuse


class Guard(msgspec.Struct, frozen=True, kw_only=True):
    secret: str
    port: int
    hosts: frozenset[str]

    @property
    def cookie(self) -> str:
        return cookie_name(self.port)

    def check(self, request: Request) -> Decision:
        """Whether ``request`` may be served; a refusal writes nothing (the app runs no
        handler for it)."""
        headers = request.headers
        host = headers.get("host", "").lower()
        if host not in self.hosts:
            return Refuse(status=403, reason=f"Host {host[:80]!r} is not this dashboard's address;"
                                             " open the URL it printed at start")
        origin = headers.get("origin")
        if origin is not None and origin.lower() != f"http://{host}":
            return Refuse(status=403, reason="cross-origin request refused; use the dashboard's own page")
        if request.method not in SAFE_METHODS:
            if origin is None:
                return Refuse(status=403, reason="a POST must carry its Origin; use the dashboard's own page")
            if not same(headers.get(CSRF_HEADER), csrf_token(self.secret)):
                return Refuse(status=403, reason="missing or wrong CSRF token; reload the page and try again")
        params = parse_qsl(request.query, keep_blank_values=True)
        token = next((value for name, value in params if name == TOKEN_PARAM), None)
        if token is not None and request.method in SAFE_METHODS:
            if not same(token, self.secret):
                return Refuse(status=403, reason="wrong token; open the URL tillerman dashboard printed at start")
            rest = urlencode([(name, value) for name, value in params if name != TOKEN_PARAM])
            # one leading slash: "//host/…" would send the browser to another site
            return Login(location="/" + request.path.lstrip("/") + (f"?{rest}" if rest else ""))
        if not same(request.cookies.get(self.cookie), self.secret):
            return Refuse(status=403, reason="not signed in; open the URL tillerman dashboard printed at start"
                                             " (it carries the token)")
        return Allow()
