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
  password, a secret query parameter's value), matched by the secret, not by a list of its
  encodings: each character as is in any case, URL-encoded once or more, JSON-escaped once or
  more (``\\/``, ``\\u002f``), HTML-escaped, mixed freely within one value; its bytes in hex; its
  base64 characters at any byte offset (a Basic header with any user name), standard or URL-safe.
  A few substring tests ("anchors") decide whether the pattern runs at all, so a text without the
  secret costs microseconds.

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
    # (the user-info runs to the authority's last '@': a password may hold one, as urlsplit reads it)
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]{0,15}://)[^/\s?#\"'<>]+@"), r"\1" + MASK + "@", ("@",)),
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


# Registered secrets are matched by the secret, not by a list of its encodings: each character may
# come in any form a server, a proxy or a renderer gives it, and the forms may mix.
_known: dict[str, None] = {}  # the registered values, in order
_known_re: re.Pattern[str] | None = None
_anchors: tuple[str, ...] = ()  # lowercase: a text holding none of these cannot hold a secret
_b64_anchors: tuple[str, ...] = ()  # base64 forms, case-sensitive
_always = False  # a secret without a usable anchor: its pattern runs on every text
_MIN_SECRET = 4  # shorter values would mask ordinary words
_ANCHOR_MIN = 4
_HTML_NAMED = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&apos;"}


def register(secret: str | None) -> None:
    """Mask this value wherever it appears from now on, in any of its encodings (`pattern_for`)."""
    global _known_re, _anchors, _b64_anchors, _always
    if not secret or len(secret) < _MIN_SECRET or secret in _known:
        return
    _known[secret] = None
    ordered = sorted(_known, key=len, reverse=True)
    _known_re = re.compile("|".join(pattern_for(s) for s in ordered), re.IGNORECASE)
    anchors, b64 = set(_anchors), set(_b64_anchors)
    for s in ordered:
        text, binary = anchors_for(s)
        anchors.update(text)
        b64.update(binary)
        _always = _always or not text
    _anchors, _b64_anchors = tuple(anchors), tuple(b64)


def _char(c: str) -> str:
    """One character of a secret in every form it takes on the way out (IGNORECASE applies):
    as is (any case), URL-encoded once or more (%2F, %252F, ...), JSON-escaped once or more
    (\\/, \\\\\\/, \\u002f), HTML-escaped (&amp;, &#47;, &#x2f;), a space as '+'."""
    forms = {re.escape(c) if c.isalnum() else "\\\\*" + re.escape(c)}
    for ch in {c, c.lower(), c.upper()}:
        if len(ch) != 1:
            continue
        forms.add("".join(f"%(?:25)*{b:02x}" for b in ch.encode("utf-8")))
        cp = ord(ch)
        units = [cp] if cp < 0x10000 else [0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF)]
        forms.add("".join(f"\\\\+u{u:04x}" for u in units))
        forms.add(f"&#0*{cp};|&#x0*{cp:x};")
    if c in _HTML_NAMED:
        forms.add(_HTML_NAMED[c])
    if c == " ":
        forms.add("\\+")
    return "(?:" + "|".join(sorted(forms, key=len, reverse=True)) + ")"


def pattern_for(secret: str) -> str:
    """A regular expression (for IGNORECASE) that matches *secret* in any of its encodings: each
    character in any of its forms (`_char`, mixed freely: a key lower-cased, then URL-encoded twice,
    then JSON-escaped), its bytes in hex, and its base64 characters (`encodings`, case kept)."""
    chars = "".join(_char(c) for c in secret)
    alts = [chars, re.escape(secret.encode("utf-8").hex())]
    alts += [f"(?-i:{re.escape(form)})" for form in _base64_forms(secret)]
    return "|".join(alts)


def anchors_for(secret: str) -> tuple[set[str], set[str]]:
    """Substrings one of which every encoding `pattern_for` matches must contain: (lowercase ones
    for the text lower-cased, base64 ones for the text as is). Empty when the secret has no run of
    letters and digits long enough to anchor on: its pattern then runs on every text."""
    runs = sorted(re.findall(r"[A-Za-z0-9]+", secret), key=len, reverse=True)
    if not runs or len(runs[0]) < _ANCHOR_MIN:
        return set(), set()
    run = runs[0]
    text = {run.lower(), run.encode().hex()}
    for head in {run[:3], run[:3].lower(), run[:3].upper()}:  # every character encoded: its first three
        text.update(
            (
                "".join(f"%{ord(ch):02x}" for ch in head),
                "".join(f"%25{ord(ch):02x}" for ch in head),
                "".join(f"\\u{ord(ch):04x}" for ch in head),
                "".join(f"&#{ord(ch)};" for ch in head),
                "".join(f"&#x{ord(ch):x};" for ch in head),
            )
        )
    return text, set(_base64_forms(secret))


def _base64_forms(secret: str) -> list[str]:
    """The base64 characters *secret* fixes at each of the three byte offsets it can start at
    inside a longer blob (a Basic header's `user:secret`, any user), standard and URL-safe."""
    raw = secret.encode("utf-8")
    out = []
    for offset in range(3):
        blob = base64.b64encode(b"\0" * offset + raw).decode()
        first, last = -(-8 * offset // 6), (8 * (offset + len(raw))) // 6  # characters all the secret's
        core = blob[first:last]
        if len(core) >= 8:
            out += [core, core.replace("+", "-").replace("/", "_")]
    return out


def encodings(secret: str) -> set[str]:
    """Common forms of a secret on the way out, as literal strings (tests check none survives):
    as is, URL-encoded (path and form, once and twice), JSON-escaped (ASCII-only or not, with or
    without escaped slashes), lower- and upper-cased, in hex, and its base64 characters."""
    import json
    from urllib.parse import quote, quote_plus

    once = quote(secret, safe="")
    out = {
        secret,
        once,
        quote(secret),
        quote_plus(secret),
        quote(once, safe=""),
        secret.lower(),
        secret.upper(),
    }
    out.add(secret.encode("utf-8").hex())
    for ascii_only in (True, False):
        escaped = json.dumps(secret, ensure_ascii=ascii_only)[1:-1]
        out.update((escaped, escaped.replace("/", "\\/")))
    out.update(_base64_forms(secret))
    return out


# A query parameter whose value is a credential (the same names the `?key=` pattern masks).
_SECRET_PARAM = re.compile(
    r"(?i)^(?:api[_-]?key|apikey|key|access[_-]?token|token|auth|password|secret|sig|signature)$"
)
_URL_IN_TEXT = re.compile(r"(?i)\b[a-z][a-z0-9+.\-]{0,15}://[^\s\"'<>]+")


def register_url(url: str | None) -> None:
    """Register a URL's user-info (user, password, and their Basic-auth form) and the values of its
    secret query parameters (``?api_key=``, ``&token=``) as secrets."""
    if not url or ("@" not in url and "=" not in url):
        return
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return
    from urllib.parse import parse_qsl

    for name, value in parse_qsl(parts.query, keep_blank_values=False):
        if _SECRET_PARAM.match(name):
            register(value)
    if password:
        register(unquote(password))
        register(password)
        pair = f"{unquote(user or '')}:{unquote(password)}"
        register(base64.b64encode(pair.encode()).decode())
    if user and not password:  # a token as the user name: http://TOKEN@host
        register(unquote(user))


def register_urls_in(obj: Any) -> None:
    """Register the credentials of every URL in a JSON-like document (a plan as loaded), the URLs
    inside its text fields too (a `name` or a `hypothesis` that quotes one)."""
    if isinstance(obj, str):
        if "://" in obj and ("@" in obj or "=" in obj):
            for url in _URL_IN_TEXT.findall(obj):
                register_url(url)
    elif isinstance(obj, dict):
        for v in obj.values():
            register_urls_in(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            register_urls_in(v)


def forget_all() -> None:
    """Tests only: drop the registered values."""
    global _known_re, _anchors, _b64_anchors, _always
    _known.clear()
    _known_re, _anchors, _b64_anchors, _always = None, (), (), False


def redact(text: str) -> str:
    """*text* with every credential masked (idempotent)."""
    if not text:
        return text
    low = text.lower()
    if _known_re is not None and (
        _always or any(a in low for a in _anchors) or any(a in text for a in _b64_anchors)
    ):
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
