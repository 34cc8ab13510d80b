"""The dashboard's Starlette application: routes, templates and the guard in front.

``make_app`` takes an open recorder (the ``tillerman dashboard`` command opens it as the
CLI does) and returns an ASGI app; a test drives it with Starlette's ``TestClient``, the
command serves it with uvicorn. Every route lives under the guard's root path
(``/d/PREFIX``) and reads the one projection ``Live`` keeps up to date; only
``POST /action/{name}`` writes, through ``actions.perform`` (the CLI's library calls).

Reading the ledger takes time on a big one (the first fold of a thread's facts reads it
all), so every handler's work runs in a worker thread, never on the event loop, which
keeps serving the live streams and the other pages meanwhile. Two locks, always taken in
this order: ``FactsOnDemand.lock`` (the facts, folded once in the background at start)
then ``Live.lock`` (the projection, and the one recorder connection). Templates escape everything (autoescape on for every file): agent text
(commands, messages, paths, titles) is never marked safe.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode

import anyio
import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tillerman.controller.core.notice_resolution import resolutions
from tillerman.controller.core.overdue import overdue
from tillerman.controller.core.timefmt import iso
from tillerman.controller.dashboard import guard as guards
from tillerman.controller.dashboard.actions import ACTIONS, ActionResult, perform
from tillerman.controller.dashboard.fleet import STATES, SORT_KEYS, Sightings, filter_rows, fleet_rows, sort_rows
from tillerman.controller.dashboard.thread_view import LIMIT, thread_view
from tillerman.controller.dashboard.live import READ_BATCH, Live
from tillerman.controller.report.fold import Facts
from tillerman.controller.report import timeline
from tillerman.controller.report.usage import UsageReport
from tillerman.ledger.events import Entry, NoticeResolved
from tillerman.ledger.labels import VERDICTS
from tillerman.ledger.recorder import Recorder
from tillerman.rules.durations import format_duration
from tillerman.rules.prices import PriceTable, load_prices

HERE = Path(__file__).parent
PAGE_SIZE = 50  # fleet rows per page: the page's DOM stays bounded whatever the fleet's size
MAX_PAGE_SIZE = 200
FORM_TYPE = "application/x-www-form-urlencoded"
MAX_FORM = 64 * 1024  # a steer's text is at most actions.TEXT_LIMIT characters
PROJECT_CHOICES = 50  # projects suggested by the fleet's filter: the most recently active

Perform = Callable[..., ActionResult]


class FleetFolds:
    """What the fleet shows beside the projection, folded one row at a time: how each
    thread is seen (``Sightings``), today's usage by session (priced by ``prices``, the
    table in force) and the notices a person resolved (``resolved``: subject -> when, as
    ``overdue`` takes them). A new day starts a new usage account, folded once from the
    ledger (today's responses may be anywhere in it)."""

    def __init__(self, recorder: Recorder, today: str, prices: PriceTable) -> None:
        self.recorder, self.prices = recorder, prices
        self.sightings = Sightings()
        self.resolved: dict[str, float] = {}
        self.day = today
        self.usage = self._usage(today)

    def _usage(self, day: str) -> UsageReport:
        return UsageReport(self.prices, by="session", since=day, until=day)

    def apply(self, entry: Entry) -> None:
        self.sightings.apply(entry)
        self.usage.add(entry.envelope)
        if isinstance(entry.envelope.event, NoticeResolved):
            self.resolved.update((subject, r.at) for subject, r in resolutions((entry,)).items())

    def usage_for(self, today: str, last_seq: int) -> UsageReport:
        if today != self.day:
            self.day, self.usage = today, self._usage(today)
            for entry in self.recorder.read(after_seq=0):
                if entry.seq > last_seq:
                    break
                self.usage.add(entry.envelope)
        return self.usage


class FactsOnDemand:
    """The ledger folded into ``Facts`` (what a thread's page, its timeline and the labels
    beside an intent read): the whole ledger once, in the background from the start, then
    what was appended since when a page asks. The fleet's live updates never pay for it.

    Not merged with ``Live``'s projection: that one starts from its saved snapshot so
    that the fleet is up at once, while ``Facts`` (the labels, the reviews, usage by
    turn) has no snapshot and must read the ledger from its first row.

    A caller holds ``lock`` while it reads the facts; each slice read from the recorder
    is read under ``reading`` (``Live.lock``), so the fleet is served between slices."""

    def __init__(self, recorder: Recorder, reading: threading.RLock, prices: PriceTable) -> None:
        self.recorder, self.reading, self.facts, self.seq = recorder, reading, Facts(prices), 0
        self.lock = threading.RLock()

    def upto(self, seq: int) -> Facts:
        with self.lock:
            while seq > self.seq:
                with self.reading:
                    entries = list(self.recorder.read(after_seq=self.seq, limit=READ_BATCH))
                for entry in entries:
                    if entry.seq > seq:
                        return self.facts
                    self.facts.apply(entry)
                    self.seq = entry.seq
                if len(entries) < READ_BATCH:
                    break
            return self.facts


def _today(now: float) -> str:
    return dt.datetime.fromtimestamp(now).date().isoformat()  # the owner's zone, as usage's default


def make_app(recorder: Recorder, *, secret: str, host: str, port: int, remote_names: tuple[str, ...] = (),
             owner: str, perform_action: Perform = perform, clock: Callable[[], float] = time.time,
             live: Live | None = None, prices: PriceTable | None = None) -> Dashboard:
    """The dashboard for ``recorder``, answering as ``host:port`` (and ``remote_names``)
    to a browser holding ``secret``; its actions are proposed as ``owner``. ``prices``:
    the price table in force (``tillerman dashboard`` gives the config's overrides too)."""
    prices = prices or load_prices()
    folds = FleetFolds(recorder, _today(clock()), prices)
    live = live or Live(recorder, folds=(folds,))
    folded = FactsOnDemand(recorder, live.lock, prices)
    guard = guards.Guard(secret=secret, port=port, hosts=guards.allowed_hosts(host, port, remote_names))
    base = guard.root + "/"  # every link of the page starts with it
    csrf = guards.csrf_token(secret)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["part"] = lambda text: quote(text, safe="")  # one path segment of a link
    env.filters["iso"] = lambda t: iso(t) if t is not None else ""
    # the two largest units ("460d7h", "6m12s"): a table stays narrow; the exact time is in a title
    env.filters["ago"] = lambda t: format_duration(max(0, int(clock() - t)), parts=2) if t is not None else ""
    env.filters["percent"] = lambda x: f"{x:.0%}" if x is not None else ""
    env.filters["usd"] = lambda x: f"${x:.2f}" if x is not None else "unknown price"  # never 0
    env.filters["tokens"] = lambda n: f"{n:,}"

    def render(name: str, status: int = 200, **context) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(csrf=csrf, csrf_header=guards.CSRF_HEADER, owner=owner,
                                                          seq=live.seq, verdicts=VERDICTS, base=base, **context),
                            status_code=status)

    async def in_worker(work: Callable[[], Response], *, with_facts: bool = False) -> Response:
        """``work`` in a worker thread, the projection (and the facts) held still meanwhile.
        The facts are caught up first, the projection free meanwhile: a long fold (the
        first, on a big ledger) does not hold up the fleet."""
        def locked() -> Response:
            with folded.lock if with_facts else contextlib.nullcontext():
                if with_facts:
                    folded.upto(live.seq)
                with live.lock:
                    return work()
        return await anyio.to_thread.run_sync(locked)

    def facts() -> Facts:
        live.refresh()
        return folded.upto(live.seq)

    def labels() -> dict:
        """The verdict standing on each labeled subject, shown beside it."""
        return {label.subject: label for label in facts().labels.all_current()}

    def late(projection, now: float) -> set[str]:
        """The intents overdue now, leaving out those whose notice a person resolved."""
        return {o.intent_id for o in overdue(projection, now, folds.resolved)}

    def rows(now: float):
        live.refresh()
        usage = folds.usage_for(_today(now), live.seq)
        return fleet_rows(live.projection, usage, now, folds.sightings.threads, resolved_at=folds.resolved)

    def recent_projects(every) -> list[str]:
        """The filter's suggestions: the ``PROJECT_CHOICES`` projects last active, not every
        project (the page stays bounded whatever the fleet's size)."""
        latest: dict[str, float] = {}
        for r in every:
            if r.project:
                latest[r.project] = max(latest.get(r.project, 0.0), r.last_event_at or 0.0)
        return sorted(sorted(latest, key=latest.__getitem__, reverse=True)[:PROJECT_CHOICES], key=str.casefold)

    def fleet_context(request: Request) -> dict:
        query = request.query_params
        state = query.get("state") if query.get("state") in STATES else None
        agent = query.get("agent") or None
        project = query.get("project") or None
        text = query.get("q") or None
        sort = query.get("sort") if query.get("sort") in SORT_KEYS else "attention"
        size = _whole(query.get("size"), PAGE_SIZE, 1, MAX_PAGE_SIZE)
        every = rows(clock())
        shown = sort_rows(filter_rows(every, state=state, agent=agent, project=project, text=text), sort)
        pages = max(1, math.ceil(len(shown) / size))
        page = _whole(query.get("page"), 1, 1, pages)
        keep = {k: v for k, v in (("state", state), ("agent", agent), ("project", project), ("q", text),
                                  ("sort", sort), ("size", size))
                if v not in (None, "attention", PAGE_SIZE)}
        return {"rows": shown[(page - 1) * size:page * size], "total": len(shown), "page": page, "pages": pages,
                "filters": {"state": state or "", "agent": agent or "", "project": project or "", "q": text or "",
                            "sort": sort},
                "states": STATES, "sort_keys": list(SORT_KEYS),
                "projects": recent_projects(every),
                "query": urlencode(keep), "prev": _page_query(keep, page - 1) if page > 1 else None,
                "next": _page_query(keep, page + 1) if page < pages else None}

    async def fleet_page(request: Request) -> Response:
        return await in_worker(lambda: render("fleet.html", **fleet_context(request)))

    async def fleet_fragment(request: Request) -> Response:
        return await in_worker(lambda: render("_fleet_table.html", **fleet_context(request)))

    def thread_context(request: Request) -> dict | None:
        """``thread_view`` of the thread, at the page the query asks (``page`` from 1,
        each list newest first), with the labels standing and the projection's view of
        each intent shown (what ``_intent.html`` draws)."""
        thread_id = request.path_params["thread_id"]
        now = clock()
        current = facts()
        usage = folds.usage_for(_today(now), live.seq)
        page = _whole(request.query_params.get("page"), 1, 1, 1 << 30)
        view = thread_view(current, folds.sightings.threads, usage, thread_id, now, page=page - 1, limit=LIMIT,
                           resolved_at=folds.resolved)
        if view.header is None:
            return None
        pages = max(1, math.ceil(max(view.counts.values(), default=0) / view.limit))
        return {"thread": view, "row": view.header, "intents": [current.projection.intents[r.intent_id]
                                                                for r in view.intents],
                "turn_usage": {line.key: line for line in view.usage.by_turn}, "overdue": late(current.projection, now),
                "labels": {label.subject: label for label in current.labels.all_current()},
                "page": page, "pages": pages,
                "prev": _page_query({}, page - 1) if page > 1 else None,
                "next": _page_query({}, page + 1) if page < pages else None}

    def thread_response(request: Request, template: str) -> Response:
        context = thread_context(request)
        if context is None:
            return PlainTextResponse("no such thread in the ledger; go back to the fleet\n", status_code=404)
        return render(template, **context)

    async def thread_page(request: Request) -> Response:
        return await in_worker(lambda: thread_response(request, "thread.html"), with_facts=True)

    async def thread_fragment(request: Request) -> Response:
        return await in_worker(lambda: thread_response(request, "_thread_live.html"), with_facts=True)

    def intent_response(request: Request) -> Response:
        live.refresh()
        view = live.projection.intents.get(request.path_params["intent_id"])
        if view is None:
            return PlainTextResponse("no such intent in the ledger\n", status_code=404)
        return render("_intent.html", view=view, overdue=late(live.projection, clock()), labels=labels())

    async def intent_fragment(request: Request) -> Response:
        return await in_worker(lambda: intent_response(request), with_facts=True)

    def timeline_response(thread_id: str) -> Response:
        data = timeline.timeline_data(facts(), thread_id=thread_id)
        if not data["threads"]:
            return PlainTextResponse("no such thread in the ledger; go back to the fleet\n", status_code=404)
        return HTMLResponse(timeline.render_html(data, assets_url=base + "timeline-assets/"))

    async def timeline_page(request: Request) -> Response:
        """The thread's timeline, the report's page with its script and style linked:
        the facts caught up when asked for (a page load, not every change)."""
        return await in_worker(lambda: timeline_response(request.path_params["thread_id"]), with_facts=True)

    async def timeline_asset(request: Request) -> Response:
        return FileResponse(timeline.ASSETS / request.url.path.rsplit("/", 1)[1])

    async def action(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ACTIONS:
            return PlainTextResponse(f"no action {name[:40]!r}; one of {', '.join(ACTIONS)}\n", status_code=404)
        body = await _bounded_body(request, MAX_FORM)
        if body is None or request.headers.get("content-type", "").split(";")[0] != FORM_TYPE:
            return PlainTextResponse(f"an action is a form ({FORM_TYPE}) of at most {MAX_FORM} bytes\n",
                                     status_code=400)
        # htmx posts url-encoded forms: read here, without a multipart parser to depend on
        fields = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))

        def act() -> Response:
            result = perform_action(recorder, name, fields, owner=owner, now=clock())
            live.refresh()
            view = live.projection.intents.get(result.intent_id) if result.intent_id else None
            return render("_action_result.html", status=200 if result.ok else 409, result=result, view=view,
                          overdue=late(live.projection, clock()), labels=labels())
        return await in_worker(act, with_facts=True)

    async def events(request: Request) -> Response:
        return StreamingResponse(live.events(), media_type="text/event-stream",
                                 headers={"x-accel-buffering": "no"})

    @contextlib.asynccontextmanager
    async def lifespan(app):
        async with anyio.create_task_group() as tg:
            await tg.start(live.run)  # following the ledger before the first page is served
            # the facts folded once now, not on the first thread page asked for
            tg.start_soon(anyio.to_thread.run_sync, folded.upto, live.seq)
            yield
            tg.cancel_scope.cancel()

    app = Starlette(routes=[Mount(guard.root, routes=[
        Route("/", fleet_page),
        Route("/fleet", fleet_fragment),
        # ids are the agent's: any character, "/" too, percent-encoded in the page's links
        Route("/thread/{thread_id:path}", thread_page),
        Route("/live/thread/{thread_id:path}", thread_fragment),
        Route("/intent/{intent_id:path}", intent_fragment),
        Route("/timeline/{thread_id:path}", timeline_page),
        *(Route(f"/timeline-assets/{name}", timeline_asset) for name in (timeline.STYLE, timeline.SCRIPT)),
        Route("/action/{name:str}", action, methods=["POST"]),
        Route("/events", events),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ])], lifespan=lifespan)
    return Dashboard(GuardMiddleware(app, guard), live)


class Dashboard:
    """The dashboard's ASGI app, and what its server does to it when told to stop: end
    every page's event stream (``Live.end_streams``). uvicorn waits for open requests
    before it stops, and a page's stream never ends by itself: Ctrl-C with a tab open
    hung until the tab closed."""

    def __init__(self, app: GuardMiddleware, live: Live) -> None:
        self.app, self.live = app, live

    async def __call__(self, scope, receive, send) -> None:
        await self.app(scope, receive, send)

    def end_streams(self) -> None:
        self.live.end_streams()


class GuardMiddleware:
    """``guard.Guard`` in front of every HTTP request: a refusal is answered here (no route
    runs, nothing is written), a login sets the cookie; every response gets the security
    headers."""

    def __init__(self, app: Starlette, guard: guards.Guard) -> None:
        self.app, self.guard = app, guard

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def secured(message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []),
                                      *((k.encode(), v.encode()) for k, v in guards.SECURITY_HEADERS.items())]
            await send(message)

        request = Request(scope)
        decision = self.guard.check(guards.Request(
            method=scope["method"], path=scope["path"], raw_path=scope.get("raw_path", b"").decode("latin-1"),
            query=scope.get("query_string", b"").decode("latin-1"),
            headers=_headers(scope), cookies=request.cookies))
        if isinstance(decision, guards.Refuse):
            response: Response = PlainTextResponse(decision.reason + "\n", status_code=decision.status)
        elif isinstance(decision, guards.Login):
            response = RedirectResponse(decision.location, status_code=303)
            # scoped to the root: never sent to another server on this host, whatever its port
            response.set_cookie(self.guard.cookie, self.guard.session, httponly=True, samesite="strict",
                                path=self.guard.root)
        else:
            return await self.app(scope, receive, secured)
        await response(scope, receive, secured)


def _headers(scope) -> Mapping[str, str]:
    """The request's headers by lower-case name; a repeated one counts as absent if its
    values differ (two Hosts: which would the browser have meant?)."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope["headers"]:
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        headers[name] = value if headers.get(name, value) == value else ""
    return headers


async def _bounded_body(request: Request, limit: int) -> bytes | None:
    """The request's body, or None when longer than ``limit`` bytes: refused on its
    Content-Length before reading, and reading stops past the limit when it has none."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def _whole(text: str | None, default: int, low: int, high: int) -> int:
    """A page number or size from the query, kept within bounds."""
    try:
        return min(max(int(text), low), high) if text else default
    except ValueError:
        return default


def _page_query(keep: dict, page: int) -> str:
    return urlencode({**keep, "page": page})
