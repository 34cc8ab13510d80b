"""The local owner is the login name of the effective uid, whatever $USER says."""

from __future__ import annotations

import os
import pwd

import pytest

from tillerman.rules import owner
from tillerman.rules.owner import local_login, owner_grant


def test_the_owner_is_the_login_name_of_the_effective_uid_not_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USER", "somebody-else")
    assert local_login() == pwd.getpwuid(os.geteuid()).pw_name


def test_the_owner_is_found_without_user_or_logname(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("USER", "LOGNAME", "USERNAME"):
        monkeypatch.delenv(name, raising=False)
    assert local_login() == pwd.getpwuid(os.geteuid()).pw_name


def test_a_uid_without_a_passwd_entry_is_named_by_number(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(owner.pwd, "getpwuid", no_entry)
    monkeypatch.setattr(owner.os, "geteuid", lambda: 12345)
    assert local_login() == "uid12345"
    assert owner_grant().subject == "owner:uid12345"


def test_the_builtin_grant_is_steer_and_queue_on_every_thread() -> None:
    grant = owner_grant("ann")
    assert (grant.subject, grant.actions, grant.threads, grant.builtin) == (
        "owner:ann", frozenset({"steer", "queue"}), "*", True)
    assert owner_grant().subject == f"owner:{local_login()}"
