"""The URL check the study's and the nightly job's configs share."""

from __future__ import annotations

import re

__all__ = ["check_http_url"]


def check_http_url(url: str) -> None:
    """An http(s) URL with a host and, if given, a numeric port; the message never echoes a
    password (the study's and the nightly job's URLs)."""
    from urllib.parse import urlsplit

    shown = re.sub(r"(://[^/@:]*:)[^@/]*@", r"\1***@", url)
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError for a non-numeric or out-of-range port
    except ValueError as exc:
        raise ValueError(f"{shown!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"{shown!r} is not an http:// or https:// URL (e.g. http://127.0.0.1:9090)"
        )
    del port
