"""A run's output directory: `answers.jsonl` (one whole JSON line per finished question), `summary.json`
(replaced atomically), and a lock held while a run writes there.

A directory is checked before any model loads: it must be writable, and it may hold nothing or an
interrupted run of the same config (which is then resumed: its finished questions are kept and not
decoded again). A finished run, or a run of another config, is never overwritten unless force=true.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from .errors import OutputError


def check_writable_dir(path: Path, label: str) -> None:
    """Make `path` and prove a file can be written there; OutputError naming `label` otherwise."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise OutputError(f"{label} {path} is not writable: {exc.strerror or exc}") from None

ANSWERS, SUMMARY, LOGGED, LOCK = "answers.jsonl", "summary.json", "logged.json", ".run.lock"


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def answers(self) -> Path:
        return self.path / ANSWERS

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY

    def recorded(self) -> dict | None:
        """The summary.json on disk, or None when there is none."""
        if not self.summary.exists():
            return None
        try:
            return json.loads(self.summary.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise OutputError(f"{self.summary} is unreadable ({exc}); move it away or choose another output_dir") from None

    @contextmanager
    def open(self, config_hash: str, force: bool):
        """Before any model loads: make the directory, check it is writable, and hold its lock (a second
        run into it fails at once). Yields whether this run resumes an interrupted one here; raises when the
        directory holds a finished run or another config's run (unless force)."""
        if self.path.exists() and not self.path.is_dir():
            raise OutputError(f"output_dir {self.path} is a file, not a directory")
        check_writable_dir(self.path, "output_dir")
        lock = FileLock(str(self.path / LOCK), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise OutputError(f"output_dir {self.path} is in use by another run") from None
        try:
            yield self.resumable(config_hash, force)
        finally:
            lock.release()

    def resumable(self, config_hash: str, force: bool) -> bool:
        recorded = self.recorded()
        if force:
            return False
        if recorded and recorded.get("complete"):
            raise OutputError(f"output_dir {self.path} holds a finished run; choose another output_dir, "
                              "or force=true to overwrite it")
        if recorded and recorded.get("config_hash") != config_hash:
            raise OutputError(f"output_dir {self.path} holds an interrupted run of another config "
                              f"(hash {recorded.get('config_hash')}, this one {config_hash}); choose another "
                              "output_dir, or force=true to overwrite it")
        if recorded is None and self.answers.exists() and self.answers.stat().st_size:
            raise OutputError(f"output_dir {self.path} holds {ANSWERS} without {SUMMARY}; choose another "
                              "output_dir, or force=true to overwrite it")
        return recorded is not None

    def finished(self) -> list[dict]:
        """The records of finished questions; a torn last line (a killed writer) is cut off the file."""
        if not self.answers.exists():
            return []
        data = self.answers.read_bytes()
        whole = data[: data.rfind(b"\n") + 1]
        if len(whole) != len(data):
            os.truncate(self.answers, len(whole))
        try:
            return [json.loads(line) for line in whole.decode("utf-8").splitlines() if line.strip()]
        except ValueError as exc:
            raise OutputError(f"{self.answers} is corrupt ({exc}); force=true starts the run afresh") from None

    def start(self, resume: bool) -> list[dict]:
        """The finished records to keep: those on disk when resuming, else none (answers.jsonl emptied)."""
        if resume:
            return self.finished()
        self.answers.write_bytes(b"")
        return []

    def append(self, record: dict) -> None:
        """One whole line, synced; on failure the file is cut back, so no half line is ever left."""
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        fd = os.open(self.answers, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            start = os.fstat(fd).st_size
            done = False
            try:
                write_all(fd, line)
                os.fsync(fd)
                done = True
            finally:
                if not done:
                    os.ftruncate(fd, start)
        except OSError as exc:
            raise OutputError(f"could not write {self.answers}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)

    def write_summary(self, summary: dict) -> None:
        atomic_write_json(self.summary, summary)

    def logged(self) -> dict[str, str | None]:
        """Where this run was logged: {logger destination: where it went}; {} when never (or unreadable)."""
        try:
            return json.loads((self.path / LOGGED).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def record_logged(self, destination: str, logged_to: str | None) -> None:
        """Note that the run reached `destination`, so that a rerun that skips it does not log it again."""
        atomic_write_json(self.path / LOGGED, {**self.logged(), destination: logged_to})


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def atomic_write_json(path: Path, data: dict) -> None:
    """A temporary file, synced, then renamed over `path`: readers see the old or the new file, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputError(f"could not write {path}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
