"""Who may ask the dashboard: pure checks of a request's facts, no I/O.

The page runs on the owner's machine beside the ledger, and its actions write to it,
so every request must come from the owner's browser, to this server, by this name:

* the path: the whole page lives under ``/d/PREFIX/``, PREFIX an HMAC of the secret.
  Browsers do not keep cookies apart by port, only by path: the cookie, scoped to that
  path, is never sent to another server on the same host (an agent's dev server on
  127.0.0.1:3000), which never sees the path either (no referrer is sent). Anything
  outside it is a plain 404 that names nothing.
* the secret: a random token kept in a 0600 file (``secret``) and printed in the URL
  at start (as Jupyter does); a GET carrying it as ``?token=`` sets an HttpOnly,
  SameSite=Strict cookie holding a session value derived from it (never the token
  itself) and redirects to the same URL without it, so it leaves the address bar. The
  printed URL stays in the browser's history and stays valid (it opens the page on a
  second device): it is a password until ``--new-secret`` rotates it. Every other
  request must carry the cookie.
* Host: one of the names the server was bound as (DNS rebinding: a page of another site
  whose name now resolves to 127.0.0.1 sends its own name as Host).
* Origin: when a request carries one it must be this server's; a POST must carry one.
* CSRF: every POST carries a token derived from the secret (an HMAC per purpose), in the
  header htmx sends from the page; a page of another origin cannot read it.

Every response carries a Content-Security-Policy that forbids inline script (all script
is a static file of ours), and headers that keep it out of caches and referrers.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, urlencode

import msgspec

from tillerman.rules.notify import is_loopback

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


def _derived(secret: str, purpose: bytes) -> bytes:
    """A value for ``purpose`` derived from the secret, which it does not reveal."""
    return hmac.new(secret.encode(), b"tillerman-dashboard-" + purpose, hashlib.sha256).digest()


def csrf_token(secret: str) -> str:
    """The token a POST carries: known to the page, which the server rendered, and to
    no other origin (it cannot read the page)."""
    return _derived(secret, b"csrf").hex()


def session(secret: str) -> str:
    """The cookie's value: proves the browser was given the secret, without being it."""
    return _derived(secret, b"session").hex()


def root(secret: str) -> str:
    """The path the whole page lives under: ``/d/`` and 132 bits of an HMAC of the secret,
    URL-safe (nobody without the secret can name it)."""
    return "/d/" + base64.urlsafe_b64encode(_derived(secret, b"prefix")).decode()[:22]


def cookie_name(port: int) -> str:
    """Cookies are not kept apart by port: two dashboards on one machine each keep their own."""
    return f"tillerman_dashboard_{port}"


def url_host(host: str) -> str:
    """``host`` as it stands in a URL: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def base_url(host: str, port: int, secret: str) -> str:
    """The page's address without the token: what ``[dashboard] url`` holds."""
    return f"http://{url_host(host)}:{port}{root(secret)}/"


def login_url(host: str, port: int, secret: str) -> str:
    return f"{base_url(host, port, secret)}?{urlencode({TOKEN_PARAM: secret})}"


def allowed_hosts(host: str, port: int, names: Iterable[str] = ()) -> frozenset[str]:
    """The ``Host`` values this server answers to: the bound address (with the loopback
    names when bound to loopback) and the names given with ``--allow-remote``, each with
    its port (``tillerman dashboard`` refuses port 80, which browsers leave out of Host)."""
    hosts = {url_host(host), *(url_host(name) for name in names)}
    if is_loopback(host.strip("[]")):
        hosts.update(LOOPBACK_NAMES)
    return frozenset(f"{h}:{port}".lower() for h in hosts)


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """What the guard looks at: the method, the path with its query string, and the
    headers (names in lower case) and cookies as sent."""

    method: str
    path: str
    raw_path: str = ""  # the path as sent, percent-encoding kept; empty: ``path``
    query: str = ""
    headers: Mapping[str, str] = {}
    cookies: Mapping[str, str] = {}


class Allow(msgspec.Struct, frozen=True):
    pass


class Login(msgspec.Struct, frozen=True, kw_only=True):
    """The right token in the URL: set the cookie, go to ``location`` (the URL without it)."""

    location: str


class Refuse(msgspec.Struct, frozen=True, kw_only=True):
    status: int  # 403: it is not allowed; 404: outside the page's path
    reason: str  # one line: why, and what to do


Decision = Allow | Login | Refuse


class Guard(msgspec.Struct, frozen=True, kw_only=True):
    secret: str
    port: int
    hosts: frozenset[str]

    @property
    def cookie(self) -> str:
        return cookie_name(self.port)

    @property
    def root(self) -> str:
        return root(self.secret)

    @property
    def session(self) -> str:
        return session(self.secret)

    def check(self, request: Request) -> Decision:
        """Whether ``request`` may be served; a refusal writes nothing (the app runs no
        handler for it)."""
        if request.path != self.root and not request.path.startswith(self.root + "/"):
            return Refuse(status=404, reason="Not Found")  # names nothing: any server may be asked
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
            # the path as sent: decoded, "/thread/a%3Fb" would become "/thread/a?b"; it
            # decodes to a path under the root (checked above): the browser stays on this server
            return Login(location=(request.raw_path or request.path) + (f"?{rest}" if rest else ""))
        if not same(request.cookies.get(self.cookie), self.session):
            return Refuse(status=403, reason="not signed in; open the URL tillerman dashboard printed at start"
                                             " (it carries the token)")
        return Allow()
