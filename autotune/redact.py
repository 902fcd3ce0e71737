"""Masking of secrets in what autotune stores, prints and exports.

Two kinds of secret reach autotune's records: the values of secret-bearing flags and keys
(``--api-key``, ``hf_token``, ``*_password``, ...) and the passwords inside URLs
(``postgresql://user:pw@host/db``). Every launch command, stored log tail, stored config,
``study best`` command and export goes through these functions, which replace them with
:data:`MASK`. Pure text functions: they take values and return values.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence

__all__ = [
    "MASK",
    "is_secret_name",
    "mask_argv",
    "mask_command",
    "mask_text",
    "mask_url_passwords",
    "url_has_password",
]

MASK = "***"

# A name ending in one of these words (snake, kebab or upper case) carries a secret:
# api_key, hf_token, HF_TOKEN, OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY, db_password, ...
# Not: tokenizer, max_num_batched_tokens, ssl_keyfile (a path), spec_tokens.
_SECRET_WORDS = r"(?:api[_-]?key|key|token|secret|password|passwd|pwd|credentials?|auth)"
_SECRET_NAME = re.compile(rf"(?i)(?:^|[_-]){_SECRET_WORDS}$|^{_SECRET_WORDS}$")
# scheme://user:password@  (the password may not contain '@', '/', whitespace or quotes)
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@'\"]*:)([^@\s'\"/]+)(@)")
# name: value / name=value / 'name': value in YAML, logs and Python reprs; a ${VAR}
# reference is not a secret and is kept
_KEYED = re.compile(
    rf"(?i)(?<![A-Za-z0-9])([A-Za-z0-9_-]*{_SECRET_WORDS})(['\"]?[ \t]*[:=][ \t]*)"
    r"(?!['\"]?\$\{)(\[[^\]\n]*\]|'[^'\n]*'|\"[^\"\n]*\"|[^\s,}\]]+)"
)


def is_secret_name(name: str) -> bool:
    """Whether a flag, key or environment variable name carries a secret."""
    return bool(_SECRET_NAME.search(name.lstrip("-")))


def url_has_password(text: str) -> bool:
    return bool(_URL_PASSWORD.search(text))


def mask_url_passwords(text: str) -> str:
    """``scheme://user:secret@host`` becomes ``scheme://user:***@host``."""
    return _URL_PASSWORD.sub(rf"\g<1>{MASK}\g<3>", text)


def _mask_keyed(m: re.Match[str]) -> str:
    name, sep, value = m.group(1), m.group(2), m.group(3)
    if not is_secret_name(name) or value in ("", "null", "None", "[]", "''", '""'):
        return m.group(0)
    if value.lower() in ("true", "false"):  # a switch such as allow_credentials
        return m.group(0)
    if value.startswith("["):
        return f"{name}{sep}['{MASK}']"
    # quoted, so that masked YAML stays YAML (a bare *** would be an alias)
    quote = value[0] if value[0] in "'\"" else '"'
    return f"{name}{sep}{quote}{MASK}{quote}"


def mask_text(text: str) -> str:
    """Mask URL passwords and ``secret_name: value`` pairs anywhere in ``text`` (YAML,
    JSON, log lines, Python reprs such as vLLM's "non-default args: {...}")."""
    return _KEYED.sub(_mask_keyed, mask_url_passwords(text))


def mask_argv(argv: Iterable[str]) -> list[str]:
    """A command line with the values of secret flags (``--api-key a b``,
    ``--hf-token=x``) and URL passwords masked; the flags themselves stay."""
    out: list[str] = []
    masking = False
    for word in argv:
        if word.startswith("-") and len(word) > 1 and not _is_number(word):
            masking = False
            name, eq, _value = word.partition("=")
            if is_secret_name(name):
                if eq:
                    out.append(f"{name}={MASK}")
                    continue
                masking = True
            out.append(mask_text(word))
        elif masking:
            out.append(MASK)
        else:
            out.append(mask_text(word))
    return out


def mask_command(command: str) -> str:
    """A shell-quoted command (``shlex.join``) with its secrets masked."""
    try:
        words: Sequence[str] = shlex.split(command)
    except ValueError:  # unbalanced quotes: not one of ours; mask it as text
        return mask_text(command)
    return shlex.join(mask_argv(words))


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True
