"""The git plumbing a bisect needs, each call one ``git`` process (no library, no shell).

Every failure a user can fix (not a repository, an unknown revision, a worktree that cannot be
added) is a :class:`~harness.errors.ConfigError` naming the repository, what git said and what to
do. Nothing here changes the user's checkout: worktrees are added under the bisect's own folder
(git records them in the repository's ``.git/worktrees``) and removed again.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from harness.errors import ConfigError


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:12]


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``git -C repo args...`` with its output captured as text; ConfigError when it fails and
    ``check`` (the message is git's own last line)."""
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              check=False)
    except FileNotFoundError:
        raise ConfigError("git is not on PATH: bisect drives git; install it") from None
    if check and done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        last = said[-1] if said else f"exit {done.returncode}"
        raise ConfigError(f"{repo}: git {' '.join(args)} failed: {last}")
    return done


def toplevel(path: Path) -> Optional[Path]:
    """The root of the git working tree ``path`` lies in (None when it lies in none)."""
    folder = path if path.is_dir() else path.parent
    if not folder.is_dir():
        return None
    done = git(folder, "rev-parse", "--show-toplevel", check=False)
    return Path(done.stdout.strip()).resolve() if done.returncode == 0 else None


def repository_root(path: Path, given_as: str) -> Path:
    """The root of the repository at ``path``; ConfigError when there is none."""
    root = toplevel(path)
    if root is None:
        raise ConfigError(f"{given_as} {path} is not inside a git repository: bisect checks out "
                          "commits of the code under test; give a folder of a git clone")
    return root


def resolve(repo: Path, rev: str, option: str) -> str:
    """The full sha of the commit ``rev`` names; ConfigError naming the option when none."""
    done = git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}",
               check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise ConfigError(f"{option} {rev}: no such commit in {repo} (a branch, tag or sha of "
                          "that repository; `git log --oneline` lists them)")
    return done.stdout.strip()


def is_ancestor(repo: Path, older: str, newer: str) -> bool:
    return git(repo, "merge-base", "--is-ancestor", older, newer, check=False).returncode == 0


def first_parent_path(repo: Path, good: str, bad: str) -> list[str]:
    """The commits after ``good`` up to ``bad`` on ``bad``'s first-parent line that descend from
    ``good``, oldest first (``bad`` last, ``good`` not included)."""
    out = git(repo, "rev-list", "--first-parent", "--ancestry-path", "--reverse",
              f"{good}..{bad}").stdout.split()
    return out


def subjects(repo: Path, shas: Sequence[str]) -> dict[str, str]:
    """sha -> the subject line of its commit message."""
    if not shas:
        return {}
    lines = git(repo, "log", "--no-walk=unsorted", "--format=%H %s", *shas).stdout.splitlines()
    return dict(line.split(" ", 1) if " " in line else (line, "") for line in lines)


def head(repo: Path) -> Optional[str]:
    done = git(repo, "rev-parse", "--verify", "--quiet", "HEAD", check=False)
    return done.stdout.strip() or None


def changed_files(repo: Path) -> list[str]:
    """Tracked files with changes not committed (staged or not), relative to the root."""
    out = git(repo, "status", "--porcelain=v1", "--untracked-files=no", "-z").stdout
    return [entry[3:] for entry in out.split("\0") if entry]


def is_tracked_unchanged(repo: Path, rel: str) -> bool:
    """Whether ``rel`` (a file or folder, relative to the root) is committed and has no local
    changes and no untracked files below it."""
    listed = git(repo, "ls-files", "--error-unmatch", "--", rel, check=False).returncode == 0
    if not listed:
        return False
    status = git(repo, "status", "--porcelain=v1", "--untracked-files=all", "--", rel).stdout
    return not status.strip()


def add_worktree(repo: Path, path: Path, sha: str) -> None:
    """A detached worktree of ``sha`` at ``path`` (reused when it is one already at ``sha``)."""
    if path.exists():
        if (path / ".git").exists() and head(path) == sha and not changed_files(path):
            return
        remove_worktree(repo, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    git(repo, "worktree", "add", "--detach", "--force", str(path), sha)


def remove_worktree(repo: Path, path: Path) -> None:
    """Remove the worktree at ``path`` and git's record of it (nothing else)."""
    git(repo, "worktree", "remove", "--force", "--force", str(path), check=False)
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
    git(repo, "worktree", "prune", check=False)
    try:
        path.parent.rmdir()  # the bisect's worktrees/ folder, once empty
    except OSError:
        pass
