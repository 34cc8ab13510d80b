"""tillerman installed as a user installs it: a wheel of this tree, a fresh virtual
environment, and one that another user (``nobody``) can run.

A test that runs tillerman as another user cannot use the suite's own environment: the
checkout may sit in a private folder (mode 0700, as a home directory is), and then that
user cannot import the editable install. So the wheel goes into a virtual environment in
a folder everyone can read, made with a Python that user can run. Plain functions, so
that the torture run (``python -m tests.faults.torture``) builds the same thing outside
pytest.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The user the read-only ledger tests run tillerman as: one who owns nothing here.
OTHER_USER = "nobody"
#: Where a system Python is looked for when other users cannot run this one.
SYSTEM_BIN = ("/usr/local/bin", "/usr/bin")
PYTHON_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


def build_wheel(source: Path, dist: Path) -> Path:
    """A wheel of this tree, built as a user's ``pip install`` builds it, from ``source``
    (an empty folder to copy the tree into) into ``dist``."""
    # From a copy of the files git would ship (tracked, or new and not ignored): setuptools
    # packs whatever a local build/ folder still holds, so a stale build of an older layout
    # would slip into a wheel of the working tree.
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "--quiet", "--disable-pip-version-check", "wheel", "--no-deps",
                    "--wheel-dir", dist, source], check=True, timeout=600)
    (built,) = dist.glob("tillerman-*.whl")
    return built


def fresh_venv(root: Path, *requirements: str | Path, python: str | Path = sys.executable) -> Path:
    """A new virtual environment in ``root``, made by ``python``, with ``requirements``
    pip-installed; its bin folder."""
    subprocess.run([str(python), "-m", "venv", root], check=True)
    pip = [root / "bin" / "python", "-m", "pip", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "install", *requirements], check=True, timeout=600)
    return root / "bin"


def as_other_user(*argv: str) -> list[str]:
    """``argv`` run as ``OTHER_USER``, in that user's group, with no supplementary groups."""
    group = grp.getgrgid(pwd.getpwnam(OTHER_USER).pw_gid).gr_name
    return ["setpriv", f"--reuid={OTHER_USER}", f"--regid={group}", "--clear-groups", *argv]


@dataclass(frozen=True)
class OtherUser:
    """``OTHER_USER``, and a Python of theirs with tillerman installed."""

    python: Path

    def command(self, *args: str) -> list[str]:
        """``python ARGS`` as that user."""
        return as_other_user(str(self.python), *args)


def why_no_other_user() -> str | None:
    """Why this run cannot act as another user (None: it can)."""
    if os.geteuid() != 0:
        return f"needs root: only root can run a command as {OTHER_USER} or give a file to {OTHER_USER}"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    try:
        pwd.getpwnam(OTHER_USER)
    except KeyError:
        return f"there is no {OTHER_USER!r} user"
    return None


def install_for_other_user(folder: Path, wheel: Path) -> OtherUser:
    """``wheel`` in a new virtual environment under ``folder`` that ``OTHER_USER`` can read
    and run; RuntimeError saying why when that user can run no Python of this version."""
    python = _python_they_can_run()
    if python is None:
        raise RuntimeError(f"{OTHER_USER} can run no Python {PYTHON_VERSION} (tried {', '.join(_candidates())})")
    folder.chmod(0o755)
    user = OtherUser(fresh_venv(folder / "venv", wheel, python=python) / "python")
    done = subprocess.run(user.command("-c", "import tillerman.controller.cli"), cwd="/", capture_output=True,
                          text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{OTHER_USER} cannot import the installed tillerman: {done.stderr.strip()[-300:]}")
    return user


def _candidates() -> list[str]:
    """This Python first; then the system's of the same version (the wheel's dependencies
    are built for it), for when this one lives where other users cannot go (~root)."""
    found = [os.path.realpath(sys.executable), *(f"{bin_dir}/python{PYTHON_VERSION}" for bin_dir in SYSTEM_BIN)]
    return list(dict.fromkeys(path for path in found if os.access(path, os.X_OK)))


def _python_they_can_run() -> str | None:
    probe = "import sys; print('%d.%d' % sys.version_info[:2])"
    for candidate in _candidates():
        done = subprocess.run(as_other_user(candidate, "-c", probe), cwd="/", capture_output=True, text=True,
                              timeout=60)
        if done.returncode == 0 and done.stdout.strip() == PYTHON_VERSION:
            return candidate
    return None


def give_to_other_user(path: Path) -> None:
    """``path`` owned by ``OTHER_USER``; where this run cannot give a file away (only root
    can), the test is skipped, with the reason, from here on."""
    if (reason := why_no_other_user()) is not None:
        pytest.skip(reason)
    entry = pwd.getpwnam(OTHER_USER)
    os.chown(path, entry.pw_uid, entry.pw_gid)
