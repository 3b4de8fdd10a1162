"""The one redaction layer: what leaves the process (store rows, reports, stdout/stderr, events,
error messages) passes through `redact` first.

It removes, wherever they appear in a text:
- URL user-info (``http://user:secret@host`` -> ``http://***@host``) and secret query parameters
  (``?api_key=...``, ``&token=...``);
- the values of Authorization, Proxy-Authorization, Cookie, Set-Cookie, X-Api-Key headers, in
  ``Name: value`` and JSON / Python-dict shapes (a server that echoes its request headers back);
- values of keys named like a secret (``"api_key": "..."``, ``password=...``);
- known token shapes: ``Bearer ...``, ``Basic <base64>``, OpenAI ``sk-...``, Hugging Face
  ``hf_...``, GitHub ``ghp_...`` / ``github_pat_...``, Slack ``xox?-...``, AWS ``AKIA...``, JWTs;
- every value registered with `register` (the API key read from the environment, a URL's
  password), wherever it appears and in every encoding a server or a client gives it: as is,
  URL-encoded, JSON-escaped (inside an echoed body), and base64 (a Basic header with any user
  name, at any byte offset).

A message that only names a secret's field ("target.api_key: field required") stays readable:
a bare `key: value` whose value is an ordinary word of an error message is not a credential.

Pure and dependency-free (the bottom layer): store, report writers and the CLI call it.
"""

from __future__ import annotations

import base64
import re
from typing import Any, TextIO
from urllib.parse import unquote, urlsplit

MASK = "***"

# (pattern, replacement, triggers): a pattern runs only when one of its triggers is in the text
# (lowercased for the case-insensitive ones); substring tests are ~100x faster than a regex pass,
# which keeps a multi-megabyte HTML report cheap to redact.
_PATTERNS: list[tuple[re.Pattern[str], str, tuple[str, ...]]] = [
    # scheme://user:password@host  and  scheme://token@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]{0,15}://)[^/\s?#@\"'<>]+@"), r"\1" + MASK + "@", ("@",)),
    # headers that carry credentials, as "Name: value", "name=value", JSON or a Python dict
    (
        re.compile(
            r"(?i)((?:proxy-)?authorization|set-cookie|cookie|x-api-key|api-key|x-auth-token)"
            r"([\"']?\s*[:=]\s*[\"']?)([^\"'\r\n}]+)"
        ),
        r"\1\2" + MASK,
        ("authorization", "cookie", "api-key", "x-auth-token"),
    ),
    # a JSON string under a key named like a secret, escapes and all ("token": "a\"b\\c")
    (
        re.compile(
            r"(?i)(\"(?:api[_-]?key|apikey|password|passwd|secret|client[_-]?secret|(?:access|auth|refresh|hf|"
            r"id|api)?[_-]?token)\"\s*:\s*)\"(?!\*\*\*\")(?:[^\"\\\r\n]|\\.)*\""
        ),
        r'\1"' + MASK + '"',
        ("key", "password", "passwd", "secret", "token"),
    ),
    # keys named like a secret
    (
        re.compile(
            r"(?i)([\"']?\b(?:api[_-]?key|apikey|password|passwd|secret|client[_-]?secret|"
            r"access[_-]?token|auth[_-]?token|refresh[_-]?token|hf[_-]?token)[\"']?\s*[:=]\s*[\"']?)"
            r"(?!\*\*\*)([^\"'\s,}&]+)"
        ),
        lambda m: _keyed(m),  # type: ignore[list-item]
        ("key", "password", "passwd", "secret", "token"),
    ),
    # secret query parameters
    (
        re.compile(
            r"(?i)([?&](?:api[_-]?key|key|access[_-]?token|token|auth|password|secret|sig|signature)=)"
            r"[^&#\s\"'<>]+"
        ),
        r"\1" + MASK,
        ("key=", "token=", "auth=", "password=", "secret=", "sig=", "signature="),
    ),
    (re.compile(r"\b(Bearer)\s+[A-Za-z0-9._~+/=\-]{4,}", re.IGNORECASE), r"\1 " + MASK, ("bearer",)),
    # Basic <base64>: a credential-looking blob (a digit, '+', '/' or '=' in it, or "user:password"
    # when decoded), not prose
    (
        re.compile(r"\b(Basic)\s+([A-Za-z0-9+/]{6,}={0,2})"),
        lambda m: _basic(m),  # type: ignore[list-item]
        ("basic",),
    ),
    (re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}"), "sk-" + MASK, ("sk-",)),
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}"), "hf_" + MASK, ("hf_",)),
    (
        re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
        "gh_" + MASK,
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    (re.compile(r"\bglpat-[A-Za-z0-9_\-]{16,}"), "glpat-" + MASK, ("glpat-",)),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9\-]{10,}"), "xox-" + MASK, ("xox",)),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "AKIA" + MASK, ("akia",)),
    (re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"), "jwt-" + MASK, ("eyj",)),
]

# Words that follow a field's name in a message about the field, never a credential.
_MESSAGE_WORDS = frozenset(
    (
        "field",
        "required",
        "unknown",
        "input",
        "must",
        "is",
        "are",
        "should",
        "not",
        "missing",
        "expected",
        "value",
        "invalid",
        "the",
        "a",
        "an",
        "cannot",
        "no",
        "give",
        "set",
        "use",
        "none",
        "null",
        "see",
        "needs",
        "wrong",
        "empty",
        "extra",
        "only",
        "was",
        "from",
    )
)


def _keyed(m: re.Match[str]) -> str:
    """`password=hunter2` -> `password=***`; `target.api_key: field required` is left alone."""
    if ":" in m.group(1) and "=" not in m.group(1) and m.group(2).lower() in _MESSAGE_WORDS:
        return m.group(0)
    return m.group(1) + MASK


def _basic(m: re.Match[str]) -> str:
    blob = m.group(2)
    if re.search(r"[0-9+/=]", blob):
        return f"{m.group(1)} {MASK}"
    try:
        decoded = base64.b64decode(blob + "=" * (-len(blob) % 4), validate=True).decode("utf-8")
    except ValueError:
        return m.group(0)
    return f"{m.group(1)} {MASK}" if ":" in decoded and decoded.isprintable() else m.group(0)


_known: set[str] = set()
_known_re: re.Pattern[str] | None = None
_MIN_SECRET = 4  # shorter values would mask ordinary words


def register(secret: str | None) -> None:
    """Mask this value wherever it appears from now on, in each of its encodings (`encodings`)."""
    global _known_re
    if not secret or len(secret) < _MIN_SECRET or secret in _known:
        return
    _known.update(e for e in encodings(secret) if len(e) >= _MIN_SECRET)
    _known_re = re.compile("|".join(re.escape(s) for s in sorted(_known, key=len, reverse=True)))


def encodings(secret: str) -> set[str]:
    """The forms a secret takes on the way out: as is, URL-encoded (path and form), JSON-escaped
    (ASCII-only or not, with or without escaped slashes), and the base64 characters it fixes at
    each of the three byte offsets it can start at inside a longer blob (a Basic header's
    `user:secret`, any user), in standard and URL-safe alphabets."""
    import json
    from urllib.parse import quote, quote_plus

    out = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}
    for ascii_only in (True, False):
        escaped = json.dumps(secret, ensure_ascii=ascii_only)[1:-1]
        out.update((escaped, escaped.replace("/", "\\/")))
    raw = secret.encode("utf-8")
    for offset in range(3):
        blob = base64.b64encode(b"\0" * offset + raw).decode()
        # characters whose 6 bits all come from the secret's bytes
        first, last = -(-8 * offset // 6), (8 * (offset + len(raw))) // 6
        core = blob[first:last]
        if len(core) >= 8:
            out.update((core, core.replace("+", "-").replace("/", "_")))
    return out


def register_url(url: str | None) -> None:
    """Register a URL's user-info (user, password, and their Basic-auth form) as secrets."""
    if not url or "@" not in url:
        return
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return
    if password:
        register(unquote(password))
        register(password)
        pair = f"{unquote(user or '')}:{unquote(password)}"
        register(base64.b64encode(pair.encode()).decode())
    if user and not password:  # a token as the user name: http://TOKEN@host
        register(unquote(user))


def register_urls_in(obj: Any) -> None:
    """Register the user-info of every URL in a JSON-like document (a plan as loaded)."""
    if isinstance(obj, str):
        if "://" in obj and "@" in obj:
            register_url(obj.strip())
    elif isinstance(obj, dict):
        for v in obj.values():
            register_urls_in(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            register_urls_in(v)


def forget_all() -> None:
    """Tests only: drop the registered values."""
    global _known_re
    _known.clear()
    _known_re = None


def redact(text: str) -> str:
    """*text* with every credential masked (idempotent)."""
    if not text:
        return text
    if _known_re is not None:
        text = _known_re.sub(MASK, text)
    low = text.lower()
    for pattern, repl, triggers in _PATTERNS:
        if any(t in low for t in triggers):
            text = pattern.sub(repl, text)
            low = text.lower()
    return text


def redact_url(url: str | None) -> str | None:
    return None if url is None else redact(url)


def redact_obj(obj: Any) -> Any:
    """A copy of a JSON-like value (dicts, lists, strings) with every string redacted; values under
    keys that name a header or a secret are masked whole."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if isinstance(k, str) and _SECRET_KEY.fullmatch(k) and isinstance(v, str) and v:
                out[k] = MASK
            else:
                out[k] = redact_obj(v)
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_obj(v) for v in obj)
    return obj


_SECRET_KEY = re.compile(
    r"(?i)(?:proxy-)?authorization|cookie|set-cookie|x-api-key|api[_-]?key|apikey|password|"
    r"passwd|secret|client[_-]?secret|(?:access|auth|refresh|hf)[_-]?token|token"
)


# C0 and C1 control characters but tab and newline: an escape sequence in a model name, a server's
# words or a stored row would drive the terminal (colours, a cleared screen, a retitled window).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """*text* with every control character but tab and newline shown as its escape (``\\x1b``)."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class RedactingStream:
    """A text stream wrapper that redacts every write (stdout/stderr of the CLI) and shows control
    characters as escapes, so nothing a server or a stored row says can drive the terminal.

    Writes are redacted one call at a time; `print` hands over whole strings, so a secret is not
    split across calls in practice. A write the stream refuses (a full disk, /dev/full) is kept in
    `failed` for the CLI to say so in one line. Everything else (isatty, fileno, encoding, flush) is
    the wrapped stream's.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.failed: OSError | None = None

    @property
    def wrapped(self) -> TextIO:
        return self._stream

    def write(self, s: str) -> int:
        try:
            self._stream.write(printable(redact(s)))
        except OSError as exc:
            self.failed = self.failed or exc
            raise
        return len(s)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self.failed = self.failed or exc
            raise

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
