"""The call log: the target's own verified calls, kept as training records for the sidecar.

Off by default. `Engine.from_pretrained(..., call_log=PATH)` (and the front-ends' `call_log`, `oospec
serve --call-log PATH`) appends one JSON line per reply whose calls the target wrote and that each fit
their schema, in the shared record format (../shared/data/toolcalls/README.md):

    {"id", "source": "call_log", "messages", "tools", "expected": [{"name", "arguments"}],
     "meta": {"time", "model", "method", "hint", "hint_tokens"}}

It stores prompts: the messages the sidecar saw (a tool's result only with `tool_results=True`; else
its content is replaced by null and `meta.tool_results` says "omitted"). The file is created 0600.

Appends never block the reply: `record` puts the line on a queue that one writer thread drains. The
writer holds an exclusive `flock` on the file while it appends, so several threads, engines and server
workers may share one log; past `max_mb` it drops the oldest records, in place under the same lock
(every writer opens the file with O_APPEND, so its next line lands after what is kept). A line that
cannot be written is a warning and a count (`errors`), never a failed reply.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import threading
import time
import uuid
import weakref
from pathlib import Path

try:
    import fcntl
except ImportError:  # not on POSIX: one process at a time
    fcntl = None

log = logging.getLogger(__name__)

#: the log's default bound, in MiB
DEFAULT_MAX_MB = 256.0
#: past the bound, the oldest records go until the log is this share of it
KEEP_SHARE = 0.75
_LIVE: "weakref.WeakSet[CallLog]" = weakref.WeakSet()


class CallLog:
    """An append-only, bounded JSONL file of verified calls, written by a thread of its own."""

    def __init__(self, path, *, max_mb: float = DEFAULT_MAX_MB, tool_results: bool = False):
        if isinstance(max_mb, bool) or not isinstance(max_mb, (int, float)) or max_mb <= 0:
            raise ValueError(f"call_log_max_mb must be a number > 0, got {max_mb!r}")
        self.path = Path(path).expanduser()
        if self.path.is_dir():
            raise ValueError(f"call_log {str(self.path)!r} is a directory; give a file path")
        if not self.path.parent.is_dir():
            raise ValueError(f"call_log {str(self.path)!r}: its directory does not exist")
        self.max_bytes = int(max_mb * 1024 * 1024)
        self.tool_results = bool(tool_results)
        self.written = 0   # records appended
        self.dropped = 0   # records dropped to keep the bound
        self.errors = 0    # records that could not be written
        self._queue: queue.Queue = queue.Queue()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # 0600 when created
        self._thread = threading.Thread(target=self._drain, name="oospec-call-log", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    # ------------------------------------------------------------------ the reply's side

    def record(self, messages: list[dict], tools: list[dict], calls: list[dict], *, model: str | None = None,
               method: str | None = None, hint: str | None = None, hint_tokens: int = 0) -> None:
        """Queue one record: `calls` are the reply's verified calls ({"name", "arguments": dict})."""
        if self._fd is None:
            return
        self._queue.put({
            "id": "log_" + uuid.uuid4().hex[:16], "source": "call_log",
            "messages": [self._kept(m) for m in messages], "tools": tools,
            "expected": [{"name": c["name"], "arguments": c["arguments"]} for c in calls],
            "meta": {"time": round(time.time(), 3), "model": model, "method": method, "hint": hint,
                     "hint_tokens": hint_tokens, "tool_results": "kept" if self.tool_results else "omitted"}})

    def _kept(self, message: dict) -> dict:
        if message.get("role") != "tool" or self.tool_results:
            return message
        return dict(message, content=None)

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until every queued record is written (or failed); False when `timeout` ran out first."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def close(self) -> None:
        """Write what is queued, stop the writer, close the file."""
        if self._fd is None:
            return
        self._queue.put(None)
        self._thread.join(timeout=10.0)
        fd, self._fd = self._fd, None
        os.close(fd)

    # ------------------------------------------------------------------ the writer's side

    def _drain(self) -> None:
        while (item := self._queue.get()) is not None:
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._append((json.dumps(item, ensure_ascii=False) + "\n").encode())
                self.written += 1
            except (OSError, TypeError, ValueError) as e:
                self.errors += 1
                log.warning("call log %s: a record could not be written (%s); the reply is unaffected", self.path, e)

    def _append(self, line: bytes) -> None:
        with _locked(self._fd):
            os.write(self._fd, line)
            if os.fstat(self._fd).st_size > self.max_bytes:
                self.dropped += _keep_newest(self.path, int(self.max_bytes * KEEP_SHARE))


class _locked:
    """An exclusive `flock` on the file for the block: other processes' writers wait."""

    def __init__(self, fd: int):
        self.fd = fd

    def __enter__(self):
        if fcntl is not None:
            fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        if fcntl is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)


def _keep_newest(path: Path, budget: int) -> int:
    """Cut the file, in place, to its newest whole lines within `budget` bytes; the count dropped."""
    with open(path, "r+b") as f:
        lines = f.read().splitlines(keepends=True)
        kept, size = [], 0
        for line in reversed(lines):
            if size + len(line) > budget:
                break
            kept.append(line)
            size += len(line)
        f.seek(0)
        f.write(b"".join(reversed(kept)))
        f.truncate()
    return len(lines) - len(kept)


def open_call_log(path, *, max_mb: float = DEFAULT_MAX_MB, tool_results: bool = False) -> CallLog | None:
    """A `CallLog` for a path (None for None); a `CallLog` passes through."""
    if path is None or isinstance(path, CallLog):
        return path
    return CallLog(path, max_mb=max_mb, tool_results=tool_results)


@atexit.register
def _close_all() -> None:
    for call_log in list(_LIVE):
        call_log.close()
