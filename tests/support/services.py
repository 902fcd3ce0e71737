"""The service-availability rule: a test that needs PostgreSQL, Prometheus, Chromium, ...
skips without it on a developer machine and fails under CI=true (``.ci/run`` starts them all).
"""

from __future__ import annotations

import os

import pytest

__all__ = ["in_ci", "need_service"]


def in_ci() -> bool:
    """True when running under CI (``.ci/run`` exports ``CI=true``)."""
    return os.environ.get("CI", "").lower() in ("true", "1")


def need_service(name: str, available: bool, reason: str) -> None:
    """Gate a test on an external service (PostgreSQL, Prometheus, ...).

    In CI a missing service is a broken CI set-up, not a reason to skip: ``.ci/run`` starts
    every service the tests need, so the test fails and says so. Elsewhere it is skipped
    with a one-line reason, so a developer without the service still gets a green suite.
    """
    if available:
        return
    if in_ci():
        pytest.fail(f"{name} is required with CI=true but unavailable: {reason}", pytrace=False)
    pytest.skip(f"{name} unavailable: {reason}")
