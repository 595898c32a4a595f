"""Shared fixtures."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def no_kvwatch_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read KVWATCH_* variables: a developer's shell must not leak into a test."""
    for key in list(os.environ):
        if key.startswith("KVWATCH_"):
            monkeypatch.delenv(key)
