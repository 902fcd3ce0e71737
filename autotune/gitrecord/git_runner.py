"""Running git for the git record (docs/git-record.md#3-safety): the repository a folder is
in (one initialised in the folder when it is in none), and commits that touch only the
record's own files.

git itself runs, as a process. History is never rewritten (no amend, reset or force push).
Every command names the record's files: ``git commit --only -- FILES`` commits those and
leaves whatever else the user staged or changed where it was. Processes of one host take
turns on a lock file in the repository's git directory; git's own ``index.lock`` (someone's
git running at the same moment) is waited out a few times. Every failure is one
:class:`~autotune.errors.ConfigError` naming the folder and git's first line."""

from __future__ import annotations

import fcntl
import functools
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import ConfigError
from autotune.gitrecord.commit_spec import RecordCommit

__all__ = ["IDENTITY", "LOCK_FILE", "GitFolder", "open_folder"]

LOCK_FILE = "autotune-record.lock"  # in the git directory: one committer at a time
# the author and committer when the repository has none configured
IDENTITY = {"user.name": "autotune", "user.email": "autotune@localhost"}
_TIMEOUT_S = 60.0  # a signing agent or hook that never returns must not hold the study
_INDEX_LOCK_WAITS_S = (0.1, 0.2, 0.4, 0.8, 1.6)
# the record's files that differ from the last commit: new, ignored or modified;
# --no-optional-locks: a look that takes no index.lock from someone's git
_STATUS = (
    "--no-optional-locks",
    "status",
    "--porcelain",
    "-z",
    "--untracked-files=all",
    "--ignored",
)
# set by a caller's own git (inside a hook): they would point every command elsewhere
_FOREIGN_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_PREFIX")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN_ENV}
    env["GIT_TERMINAL_PROMPT"] = "0"  # never ask anyone anything
    return env


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")[:300]


def _git(
    cwd: Path, args: Sequence[str], *, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``git ARGS`` in ``cwd`` (``--literal-pathspecs``: a folder named ``a[1]`` is that
    folder, not a pattern); git missing or stuck is the folder's error."""
    try:
        return subprocess.run(
            ["git", "--literal-pathspecs", *args],
            cwd=cwd,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=_env(),
            timeout=_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError as exc:
        raise ConfigError(f"record.git {cwd}: git is not installed (not on PATH)") from exc
    except subprocess.TimeoutExpired as exc:
        raise ConfigError(
            f"record.git {cwd}: `git {args[0]}` did not finish in {_TIMEOUT_S:.0f} s"
        ) from exc
    except OSError as exc:
        raise ConfigError(f"record.git {cwd}: cannot run git ({exc.strerror or exc})") from exc


def _failed(folder: Path, what: str, r: subprocess.CompletedProcess[str]) -> ConfigError:
    why = _first_line(r.stderr) or _first_line(r.stdout) or f"exit status {r.returncode}"
    return ConfigError(f"record.git {folder}: `git {what}` failed: {why}")


@dataclass(frozen=True)
class GitFolder:
    """The record's folder (absolute), the top of its work tree, its git directory and the
    folder as a path from the top (``.`` when it is the top)."""

    folder: Path
    top: Path
    git_dir: Path
    rel: str

    def _path(self, name: str) -> str:
        return name if self.rel == "." else f"{self.rel}/{name}"

    def _run(self, what: str, args: Sequence[str], stdin: str | None = None) -> None:
        """``git ARGS`` at the top, waiting out another git's ``index.lock`` a few times."""
        for wait in (*_INDEX_LOCK_WAITS_S, None):
            r = _git(self.top, args, stdin=stdin)
            if r.returncode == 0:
                return
            if wait is None or "index.lock" not in r.stderr:
                raise _failed(self.folder, what, r)
            time.sleep(wait)

    def _has_head(self) -> bool:
        return _git(self.top, ["rev-parse", "--verify", "--quiet", "HEAD"]).returncode == 0

    def messages(self) -> list[str]:
        """The messages of the commits that changed the folder, newest first."""
        if not self._has_head():
            return []
        r = _git(self.top, ["log", "--format=%B%x00", "--", self.rel])
        if r.returncode != 0:
            raise _failed(self.folder, "log", r)
        return [m.strip() for m in r.stdout.split("\0") if m.strip()]

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Held while a process reads what is committed and commits the rest: the lanes and
        controllers of one host then commit one after another, each trial once."""
        path = self.git_dir / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(
                f"record.git {self.folder}: cannot open {path} ({exc.strerror or exc})"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    @functools.cached_property
    def _identity(self) -> list[str]:
        """``-c user.name=autotune`` (and the e-mail) where the repository has none (looked
        up once per call of the record)."""
        out: list[str] = []
        for key, value in IDENTITY.items():
            if _git(self.top, ["config", "--get", key]).returncode != 0:
                out += ["-c", f"{key}={value}"]
        return out

    def _write(self, c: RecordCommit) -> None:
        for name, text in c.files.items():
            path = self.folder / name
            tmp = path.with_name(f".{path.name}.tmp")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(text, encoding="utf-8")
                if name in c.executable:
                    tmp.chmod(0o755)
                os.replace(tmp, path)
            except OSError as exc:
                raise ConfigError(
                    f"record.git {self.folder}: cannot write {name} ({exc.strerror or exc})"
                ) from exc

    def _changed(self, paths: Sequence[str]) -> bool:
        """Whether the files differ from the last commit."""
        r = _git(
            self.top,
            [*_STATUS, "--", *paths],
        )
        if r.returncode != 0:
            raise _failed(self.folder, "status", r)
        return bool(r.stdout.strip("\0"))

    def _untracked(self, paths: Sequence[str]) -> list[str]:
        r = _git(self.top, ["ls-files", "-z", "--", *paths])
        if r.returncode != 0:
            raise _failed(self.folder, "ls-files", r)
        known = set(r.stdout.split("\0"))
        return [p for p in paths if p not in known]

    def commit(self, c: RecordCommit) -> bool:
        """Write ``c``'s files and commit them, and only them; False (no commit) when they
        are as the last commit left them. The index is left as the user had it: a new file
        is only marked (``--intent-to-add``), which a failed commit takes back."""
        self._write(c)
        paths = [self._path(n) for n in c.files]
        if not self._changed(paths):
            return False
        new = self._untracked(paths)
        if new:  # --force: the record's own files, also where a .gitignore covers them
            self._run("add", ["add", "--force", "--intent-to-add", "--", *new])
        args = [*self._identity, "commit", "--quiet", "--only", "--file=-", "--", *paths]
        try:
            self._run("commit", args, stdin=c.message)
        except ConfigError:
            if new:  # best effort: the next commit marks them again
                _git(self.top, ["rm", "--cached", "--quiet", "--", *new])
            raise
        return True


def open_folder(path: str | Path) -> GitFolder:
    """The git record's folder ``path`` (created when missing) in its repository; a folder
    in no repository becomes one (``git init``). A repository git refuses (another user's,
    a broken one) is an error, never replaced."""
    folder = Path(path).expanduser().absolute()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"record.git {folder}: cannot create it ({exc.strerror or exc})") from exc
    where = ["rev-parse", "--show-toplevel", "--absolute-git-dir"]
    r = _git(folder, where)
    if r.returncode != 0 and "not a git repository" in r.stderr:
        # two committers can init one new folder at once: the second `git init` then fails
        # on a lock or file the first is making (its config lock, `info/exclude`), and the
        # repository reads back only once the first is done: wait it out as the index lock is
        for wait in (*_INDEX_LOCK_WAITS_S, None):
            init = _git(folder, ["init", "--quiet"])
            r = _git(folder, where)
            if init.returncode == 0 or r.returncode == 0:
                break
            if wait is None:
                raise _failed(folder, "init", init)
            time.sleep(wait)
    if r.returncode != 0:
        raise _failed(folder, "rev-parse", r)
    top, git_dir = (Path(p) for p in r.stdout.splitlines()[:2])
    rel = os.path.relpath(folder.resolve(), top.resolve())
    if rel.startswith(".."):  # inside the git directory, say
        raise ConfigError(f"record.git {folder}: not inside the work tree of {top}")
    return GitFolder(folder, top, git_dir, Path(rel).as_posix())
