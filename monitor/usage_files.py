"""Usage straight from the agents' folders, fast: ``tillerman usage ~/.claude/projects
~/.codex/sessions`` without a ledger, the job ccusage does.

The full parsers (``codex_rollout``, ``claude_transcript``) read every record of a file;
a usage report needs a few. Each file is read whole and each line searched for the bytes
of the lines that can matter (``_CODEX_NEEDLES``, ``_CLAUDE_NEEDLES``) before any is
decoded; only those are decoded, into Structs that declare the few fields read. What comes out is what the full parsers give for the same lines: the
``Usage`` events under the same event ids (file identity, offset, index), thread ids and
turn ids, made by the same functions (``token_count_usage``, ``transcript_usage``), and a
``Quarantined`` record for a line that cannot be counted. Both are checked against the
full parsers on every recorded session (tests/monitor/test_usage_files.py).

Files are found as ccusage finds them: every ``*.jsonl`` under a folder, in sorted order,
each told a Codex rollout or a Claude Code transcript by its opening
(``formats.detect_format``); files of other formats are named and left out.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from tillerman.ledger import frames
from tillerman.ledger.events import Envelope, Quarantined
from tillerman.ledger.usage import UsageRefused
from tillerman.monitor.formats import detect_format
from tillerman.monitor.identity import FIRST_LINE_LIMIT, event_ids, stat_identity
from tillerman.monitor.lines import WRONG_TYPE, decode_record
from tillerman.monitor.parser import WrongType, as_text, iso_time, source_time
from tillerman.monitor.tailer import file_source

HEAD_BYTES = 64 * 1024  # enough of a file's opening to tell its format

#: The bytes of every line a usage report reads. Codex: the usage itself, the thread
#: (``session_meta``), the model (``turn_context``) and what opens and closes turns. (The
#: quoted values alone: a line written with spaces, ``"type": "token_count"``, holds them too.)
_CODEX_NEEDLES = re.compile(rb'"(?:token_count|turn_context|session_meta|task_started|task_complete|turn_aborted'
                            rb'|user_message)"')
#: Claude Code: the usage, and every line that opens a thread or opens or closes a turn
#: (a usage event's id counts the events its line gives before it: a thread's opening among them).
#: JSON allows whitespace around the colon (``"type": "assistant"``); the parsers read such a
#: line, so it is found here too (a line holds no newline: spaces, tabs and carriage returns).
_CLAUDE_NEEDLES = re.compile(rb'"type"[ \t\r]*:[ \t\r]*"(?:assistant|user|system|attachment|queue-operation|cost-state)"')


class UsageFile(msgspec.Struct, kw_only=True, tag=True):
    """One file's usage: its ``Usage`` and ``Quarantined`` envelopes in file order."""

    path: str
    source: str  # the envelopes' source (``file:<path>``), as replay names it
    kind: str  # "codex" | "claude"
    envelopes: list[Envelope]


class UsageFilesError(ValueError):
    """A path given that is neither a folder nor a readable file."""


def usage_file_paths(paths: Iterable[str]) -> list[Path]:
    """The ``*.jsonl`` files named or under the folders named, each folder's sorted by path."""
    found: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*.jsonl") if p.is_file() and not p.is_symlink()))
        elif path.is_file():
            found.append(path)
        else:
            raise UsageFilesError(f"{name}: no such file or folder")
    return found


def read_usage_files(paths: Iterable[Path], progress: Callable[[int, int], None] | None = None, *,
                     jobs: int = 1) -> Iterator[UsageFile | str]:
    """Each file's usage in the order given, or its path (a ``str``) when it is no Codex
    rollout or Claude Code transcript. ``progress(done, total)`` after each file.
    ``jobs`` > 1: read by that many forked processes, for a folder of ``POOL_FROM`` files
    or more (fewer are read before the processes would have started)."""
    paths = list(paths)
    found = _pooled(paths, jobs) if jobs > 1 and len(paths) >= POOL_FROM else map(read_usage_file, paths)
    for done, (path, usage) in enumerate(zip(paths, found, strict=True), 1):
        yield usage or str(path)
        if progress is not None:
            progress(done, len(paths))


POOL_FROM = 64


class _Failed(msgspec.Struct, tag=True):
    """A file a forked reader could not read: the ``OSError`` to raise here."""

    errno: int
    strerror: str
    filename: str


_decode_found = msgspec.msgpack.Decoder(UsageFile | _Failed | None).decode


def _pooled(paths: list[Path], jobs: int) -> Iterator[UsageFile | None]:
    """``read_usage_file`` of each path, in order, read by ``jobs`` forked processes: the
    k-th takes every ``jobs``-th file from the k-th and sends each one's envelopes back,
    msgpack-encoded, through a pipe of its own (``tillerman.ledger.frames``), whose buffer
    lets it read ahead. Reading and decoding are most of the work and need nothing of this
    process's but the module. (A ``multiprocessing`` pool cost this process half as much
    again in its result threads.) The children ignore SIGINT: a Ctrl-C reaches this
    process, which ends them."""
    children: list[tuple[int, Any]] = []
    try:
        for k in range(jobs):
            children.append(_fork_reader(paths[k::jobs], [pipe for _, pipe in children]))
        for i in range(len(paths)):
            body = frames.receive(children[i % jobs][1])
            if body is None:
                raise OSError(f"{paths[i]}: the process reading it ended before sending it")
            found = _decode_found(body)
            if isinstance(found, _Failed):
                raise OSError(found.errno, found.strerror, found.filename)
            yield found
    finally:
        for pid, pipe in children:
            pipe.close()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # done already, or no longer listened to
            os.waitpid(pid, 0)


def _fork_reader(paths: list[Path], inherited: list) -> tuple[int, Any]:
    """A child reading ``paths`` in order, and the pipe its envelopes come through."""
    read_fd, write_fd = os.pipe()
    frames.widen(write_fd)
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            os.close(read_fd)
            for pipe in inherited:  # the other readers' pipes: theirs to end
                pipe.close()
            with open(write_fd, "wb", buffering=0) as pipe:
                for path in paths:
                    frames.send(pipe, _read_encoded(path))
            status = 0
        except BrokenPipeError:
            pass  # nobody reads any more
        except BaseException:  # a fault of ours: said here; the parent says which file
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(status)
    os.close(write_fd)
    return pid, open(read_fd, "rb", buffering=frames.PIPE_BYTES)


def _read_encoded(path: Path) -> bytes:
    try:
        return msgspec.msgpack.encode(read_usage_file(path))
    except OSError as exc:
        return msgspec.msgpack.encode(_Failed(exc.errno or 0, exc.strerror or str(exc), str(path)))


def read_usage_file(path: Path) -> UsageFile | None:
    """The usage of one file; None when it is no Codex rollout or Claude Code transcript."""
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        head = fh.read(HEAD_BYTES)
        reader = _READERS.get(detect_format(head, str(path)) or "")
        if reader is None:
            return None
        first_line = head[:min(head.find(b"\n") + 1 or len(head), FIRST_LINE_LIMIT)]
        fh.seek(0)
        source = file_source(path)
        kind, read = reader
        envelopes = read(_Lines(fh, source, stat_identity(st, first_line)), str(path))
    return UsageFile(path=str(path), source=source, kind=kind, envelopes=envelopes)


CHUNK = 16 << 20  # read at a time: memory stays flat however large a file is


class _Lines:
    """The lines of a file that hold any of some needles, and the envelopes made of them."""

    def __init__(self, fh, source: str, identity: str) -> None:
        self.fh, self.source = fh, source
        self.event_id = event_ids(identity)
        self.out: list[Envelope] = []

    def matching(self, needles: re.Pattern[bytes]) -> Iterator[tuple[int, int, bytes]]:
        """(offset, length, body) of each line holding a needle, in file order; ``length``
        counts the newline, as the parsers do. (Splitting a chunk into lines and searching
        each for any needle at once is about three times faster than finding each needle
        in the whole chunk.)"""
        start, rest, search = 0, b"", needles.search
        while data := self.fh.read(CHUNK):
            data = rest + data
            cut = data.rfind(b"\n") + 1  # complete lines only: the rest joins the next chunk
            rest = data[cut:]
            for body in data[:cut].split(b"\n")[:-1]:
                if search(body):
                    yield start, len(body) + 1, body
                start += len(body) + 1
        if rest and search(rest):  # a last line without its newline
            yield start, len(rest), rest

    def add(self, event, start: int, length: int, at: float | None, index: int = 0) -> None:
        """``index``: the events the full parser gives for this line before this one."""
        self.out.append(Envelope(event_id=self.event_id(start, index), event=event, source=self.source, at=at,
                                 offset=start, length=length))

    def quarantine(self, start: int, length: int, reason: str) -> None:
        self.out.append(Envelope(event_id=self.event_id(start, 0), source=self.source, offset=start, length=length,
                                 event=Quarantined(source=self.source, offset=start, length=length, reason=reason)))

    @staticmethod
    def refused_reason(body: bytes, length: int) -> str:
        """Why a line the Structs did not take is refused, as the full parsers say it."""
        record = decode_record(body, length > len(body))
        return record if isinstance(record, str) else WRONG_TYPE


def _time(stamp: Any) -> float | None:
    return source_time(iso_time(stamp))


# -- Codex rollouts ----------------------------------------------------------------------


class _CodexPayload(msgspec.Struct):
    type: Any = None
    id: Any = None  # session_meta: the thread
    turn_id: Any = None  # task_started, task_complete, turn_aborted, turn_context
    model: Any = None  # turn_context
    info: Any = None  # token_count


class _CodexLine(msgspec.Struct):
    type: Any = None
    timestamp: Any = None
    payload: _CodexPayload | None = None


_decode_codex = msgspec.json.Decoder(_CodexLine).decode


class _CodexFile:
    """The little the full parser keeps of a rollout to name a usage's thread, turn and model."""

    def __init__(self, path: str) -> None:
        from tillerman.monitor.codex_rollout import rollout_thread_from_path

        self.thread: str | None = rollout_thread_from_path(path)
        self.turn: str | None = None
        self.explicit_turns = False
        self.model: str | None = None  # the latest turn_context's
        self.context_turn: str | None = None  # the latest turn_context's turn (0.163 and later)
        self.previous_total = None

    def line(self, lines: _Lines, start: int, length: int, body: bytes, token_count_usage) -> None:
        try:
            record = _decode_codex(body)
        except (msgspec.DecodeError, RecursionError):
            return lines.quarantine(start, length, lines.refused_reason(body, length))
        body = record.payload or _CodexPayload()
        try:
            as_text(record.timestamp, "timestamp")
            if record.type == "session_meta":
                self.thread = as_text(body.id, "id") or self.thread
            elif record.type == "turn_context":
                self.model, self.context_turn = as_text(body.model, "model"), as_text(body.turn_id, "turn_id")
            elif record.type == "event_msg":
                self._event(lines, start, length, record, body, token_count_usage)
        except UsageRefused as refused:
            lines.quarantine(start, length, refused.reason)
        except WrongType:
            lines.quarantine(start, length, WRONG_TYPE)

    def _event(self, lines: _Lines, start: int, length: int, record: _CodexLine, body: _CodexPayload,
               token_count_usage) -> None:
        kind = body.type
        if kind == "token_count":
            usage = token_count_usage({"type": kind, "info": body.info}, thread_id=self.thread,
                                      turn_id=self.context_turn or self.turn,
                                      model=self.model, previous_total=self.previous_total)
            if usage is not None:
                self.previous_total = usage.total
                lines.add(usage, start, length, _time(record.timestamp))
        elif kind == "task_started":
            self.explicit_turns = True
            self.turn = as_text(body.turn_id, "turn_id") or f"turn@{start}"
        elif kind in ("task_complete", "turn_aborted"):
            if (as_text(body.turn_id, "turn_id") or self.turn) == self.turn:
                self.turn = None
        elif kind == "user_message" and not self.explicit_turns:
            self.turn = f"turn@{start}"  # old CLIs: each user message opens the next turn


def _read_codex(lines: _Lines, path: str) -> list[Envelope]:
    from tillerman.monitor.codex_rollout import token_count_usage

    state = _CodexFile(path)
    for start, length, body in lines.matching(_CODEX_NEEDLES):
        state.line(lines, start, length, body, token_count_usage)
    return lines.out


# -- Claude Code transcripts -----------------------------------------------------------


class _Block(msgspec.Struct):
    type: Any = None
    text: Any = None
    id: Any = None  # a tool call's
    tool_use_id: Any = None  # a tool result's


class _ClaudeMessage(msgspec.Struct):
    id: Any = None
    model: Any = None
    usage: Any = None
    stop_reason: Any = None
    # The blocks' types and texts only: a tool result's or a tool call's body is skipped.
    content: list[_Block | str | int | float | bool | list | None] | str | None = None


class _ClaudeLine(msgspec.Struct):
    type: Any = None
    timestamp: Any = None
    sessionId: Any = None  # noqa: N815 (the transcript's names)
    agentId: Any = None  # noqa: N815
    isSidechain: Any = None  # noqa: N815
    uuid: Any = None
    parentUuid: Any = None  # noqa: N815
    requestId: Any = None  # noqa: N815
    isMeta: Any = None  # noqa: N815
    isCompactSummary: Any = None  # noqa: N815
    isApiErrorMessage: Any = None  # noqa: N815
    subtype: Any = None
    totalCostUSD: Any = None  # noqa: N815 (cost-state)
    modelUsage: Any = None  # noqa: N815 (cost-state)
    message: _ClaudeMessage | None = None


_decode_claude = msgspec.json.Decoder(_ClaudeLine).decode
_CONVERSATION = frozenset({"user", "assistant", "system", "attachment"})  # the lines a thread is named from


class _ClaudeFile:
    """The little the full parser keeps of a transcript to name a usage's thread, turn and
    event id: the threads opened, each one's open turn, and the chains of a 1.0.x file's
    unnamed sidechains."""

    def __init__(self, path: str) -> None:
        from tillerman.monitor.claude_transcript import SUBAGENT_FILE

        found = SUBAGENT_FILE.search(path)
        self.file_session, self.file_agent = (found.group(1), found.group(2)) if found else (None, None)
        self.turns: dict[str | None, str | None] = {}  # every thread opened, and its open turn
        self.side_roots: dict[str, str] = {}
        self.side_root: str | None = None
        # Tool calls started and not answered, and those answered: the CLI's exit (its
        # cost-state line) ends the open ones, events that come before its own account.
        self.open_calls: dict[str, None] = {}
        self.done_calls: set[str] = set()

    def line(self, lines: _Lines, start: int, length: int, body: bytes, readers) -> None:
        transcript_usage, cost_state_usage = readers
        try:
            record = _decode_claude(body)
        except (msgspec.DecodeError, RecursionError):
            return lines.quarantine(start, length, lines.refused_reason(body, length))
        try:
            as_text(record.timestamp, "timestamp")
            session = as_text(record.sessionId, "sessionId") or self.file_session
            if record.type == "cost-state":
                self._exit(lines, start, length, record, cost_state_usage(
                    {"totalCostUSD": record.totalCostUSD, "modelUsage": record.modelUsage}, thread_id=session))
            elif record.type == "queue-operation":
                self._open(session)
            elif record.type in _CONVERSATION:
                self._conversation(lines, start, length, record, session, transcript_usage)
        except UsageRefused as refused:
            lines.quarantine(start, length, refused.reason)
        except WrongType:
            lines.quarantine(start, length, WRONG_TYPE)

    def _exit(self, lines: _Lines, start: int, length: int, record: _ClaudeLine, reported) -> None:
        """``cost-state``: the CLI exits. Its open calls and turns end, then its account."""
        ended = len(self.open_calls) + sum(1 for turn in self.turns.values() if turn is not None)
        self.done_calls.update(self.open_calls)
        self.open_calls.clear()
        self.turns = dict.fromkeys(self.turns)
        lines.add(reported, start, length, _time(record.timestamp), ended)

    def _open(self, thread: str | None) -> int:
        """Registers the thread; 1 when this line opens it (the parser's ``ThreadStarted``)."""
        if thread is None or thread in self.turns:
            return 0
        self.turns[thread] = None
        return 1

    def _conversation(self, lines: _Lines, start: int, length: int, record: _ClaudeLine, session: str | None,
                      transcript_usage) -> None:
        thread = self._thread_of(record, session, start)
        message = record.message or _ClaudeMessage()
        blocks = _blocks(message.content)
        turn = self.turns.get(thread)
        usage, said = None, 0
        if record.type == "user":
            turn = self._user(record, blocks, turn, start)
        elif record.type == "assistant":
            usage = transcript_usage(_claude_entry(record, message), thread_id=thread, turn_id=turn)
            said = sum(1 for block in blocks if block.type == "tool_use" or (block.type == "text" and _said(block)))
            for block in blocks:
                if block.type == "tool_use":
                    self._call_started(as_text(block.id, "id") or f"tool@{start}")
            if record.isApiErrorMessage or as_text(message.stop_reason, "stop_reason") == "end_turn":
                turn = None
        elif record.type == "system" and as_text(record.subtype, "subtype") in ("stop_hook_summary", "turn_duration"):
            turn = None
        opening = self._open(thread)
        if thread is not None:
            self.turns[thread] = turn
        if usage is not None:  # after the line's thread opening, messages and tool calls
            lines.add(usage, start, length, _time(record.timestamp), opening + said)

    def _user(self, record: _ClaudeLine, blocks: list[_Block], turn: str | None, start: int) -> str | None:
        """The thread's open turn after a user line: a prompt opens one, an interrupt ends it."""
        from tillerman.monitor.claude_transcript import _LOCAL_INPUT, INTERRUPT_MARKER

        answered = [self._call_answered(as_text(b.tool_use_id, "tool_use_id") or f"tool@{start}") for b in blocks
                    if b.type == "tool_result"]
        said = [as_text(b.text, "text") or "" for b in blocks if b.type == "text"]
        prompt = "\n".join(said)
        if prompt.startswith(INTERRUPT_MARKER):
            return None
        if (not said or record.isMeta or record.isCompactSummary or any(answered)
                or prompt.lstrip().startswith(_LOCAL_INPUT)):
            return turn
        return as_text(record.uuid, "uuid") or f"line@{start}"

    def _call_started(self, call_id: str) -> None:
        if call_id not in self.open_calls and call_id not in self.done_calls:
            self.open_calls[call_id] = None

    def _call_answered(self, call_id: str) -> bool:
        """Whether this tool result is news (the parser's ``item_completed``), not a repeat."""
        if call_id in self.done_calls:
            return False
        self.open_calls.pop(call_id, None)
        self.done_calls.add(call_id)
        return True

    def _thread_of(self, record: _ClaudeLine, session: str | None, start: int) -> str | None:
        """``ClaudeTranscriptParser._thread_of``: the session, or one of its subagents."""
        agent = as_text(record.agentId, "agentId") or self.file_agent
        if not isinstance(record.isSidechain, bool | None):
            raise WrongType("isSidechain")
        if not (record.isSidechain or self.file_agent) or session is None:
            return session
        if agent:
            return f"{session}/agent-{agent}"
        return f"{session}/sidechain{self._sidechain_root(record, start)}"

    def _sidechain_root(self, record: _ClaudeLine, start: int) -> str:
        """``ClaudeTranscriptParser._sidechain_root``: "" for a file's first chain of
        unnamed sidechain lines, ``-<root uuid>`` for later ones."""
        uuid, parent = as_text(record.uuid, "uuid"), as_text(record.parentUuid, "parentUuid")
        if parent is None or self.side_root is None:
            root = "" if self.side_root is None else f"-{uuid or f'line@{start}'}"
        else:
            root = self.side_roots.get(parent, self.side_root)
        if uuid is not None:
            self.side_roots[uuid] = root
        self.side_root = root
        return root


def _blocks(content) -> list[_Block]:
    """A message's blocks, as ``content_blocks`` reads them: a string is one text block."""
    if isinstance(content, str):
        return [_Block("text", content)]
    return [block for block in content or () if block.__class__ is _Block]


def _said(block: _Block) -> bool:
    """A text block: the parser's agent message (a text that is no string refuses the line)."""
    as_text(block.text, "text")
    return True


def _claude_entry(record: _ClaudeLine, message: _ClaudeMessage) -> dict:
    """The fields of a transcript line ``transcript_usage`` reads, as the line has them."""
    return {"type": record.type, "requestId": record.requestId, "isSidechain": record.isSidechain,
            "message": {"id": message.id, "model": message.model, "usage": message.usage}}


def _read_claude(lines: _Lines, path: str) -> list[Envelope]:
    from tillerman.monitor.claude_transcript import cost_state_usage, transcript_usage

    state = _ClaudeFile(path)
    readers = (transcript_usage, cost_state_usage)
    for start, length, body in lines.matching(_CLAUDE_NEEDLES):
        state.line(lines, start, length, body, readers)
    return lines.out


_READERS: dict[str, tuple[str, Callable[[_Lines, str], list[Envelope]]]] = {
    "codex-rollout": ("codex", _read_codex),
    "claude-transcript": ("claude", _read_claude),
}
