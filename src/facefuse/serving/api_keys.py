"""API keys.

Two settings (``Settings.api_keys`` / ``admin_keys``, read from these environment
variables like every setting), each a list of entries separated by commas and/or
whitespace (so a mounted secret file with one key per line works too)::

    FACEFUSE_API_KEYS="mobile:3fX9...,web:Qm7p..."     # may call /v1/* routes
    FACEFUSE_ADMIN_KEYS="ops:Zr8k..."                   # may also call admin routes

An entry is ``[label:]token``. The optional ``label`` (``[A-Za-z0-9_.-]``, at most 64)
names the key in logs; without one the log name is ``key-`` plus the first 8 hex of
the token's SHA-256. Tokens are RFC 6750 ``b64token`` characters
(``A-Z a-z 0-9 - . _ ~ + /`` then optional ``=`` padding) and at least
:data:`MIN_TOKEN_LENGTH` long; make one with
``python -c "import secrets; print(secrets.token_urlsafe(32))"``.

Clients send ``Authorization: Bearer <token>``. Admin keys are valid on every route.

* No key configured at all: authentication is off (the embedded default for
  ``make serve`` on a laptop); the ``/v1`` API routes are open, but the admin routes
  (model reload, cache purge) answer 403 ``forbidden`` unless
  ``FACEFUSE_ADMIN_OPEN=true`` (local development only).
* Any key configured: every protected route needs a valid key (401 ``unauthorized``
  otherwise); admin routes need an admin key (403 ``forbidden`` for a valid
  non-admin key, and for everyone when only FACEFUSE_API_KEYS is set).

Tokens are compared in constant time against every configured key
(:func:`hmac.compare_digest` over SHA-256 digests, so neither the position of the
first wrong character nor the token length leaks). Tokens never appear in logs,
errors or ``repr``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

from facefuse.config import Settings
from facefuse.errors import (
    ForbiddenError,
    InvalidArgumentError,
    UnauthorizedError,
)

__all__ = [
    "MIN_TOKEN_LENGTH",
    "ApiKey",
    "ApiKeys",
    "bearer_token",
]

#: Shortest token accepted in FACEFUSE_API_KEYS / FACEFUSE_ADMIN_KEYS.
MIN_TOKEN_LENGTH = 16

_LABEL = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_BEARER = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +(\S+) *")


@dataclass(frozen=True)
class ApiKey:
    """One configured key: its log label, whether it is an admin key, and its digest."""

    label: str
    admin: bool
    digest: bytes

    def __repr__(self) -> str:
        return f"ApiKey(label={self.label!r}, admin={self.admin})"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def _parse_entries(value: str, *, admin: bool, var: str) -> list[ApiKey]:
    keys: list[ApiKey] = []
    for entry in re.split(r"[,\s]+", value.strip()):
        if not entry:
            continue
        label, sep, token = entry.partition(":")
        if not sep:
            label, token = "", entry
        elif not _LABEL.fullmatch(label):
            raise InvalidArgumentError(f"{var}: bad key label {label[:64]!r} (use A-Za-z0-9_.-)")
        if not _TOKEN.fullmatch(token):
            name = f"key {label!r}" if label else "a key"
            raise InvalidArgumentError(
                f"{var}: {name} has characters a Bearer token cannot carry "
                "(allowed: A-Z a-z 0-9 - . _ ~ + / and trailing =)"
            )
        if len(token) < MIN_TOKEN_LENGTH:
            name = f"key {label!r}" if label else "a key"
            raise InvalidArgumentError(
                f"{var}: {name} is shorter than {MIN_TOKEN_LENGTH} characters"
            )
        digest = _digest(token)
        keys.append(ApiKey(label or "key-" + digest.hex()[:8], admin, digest))
    return keys


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header value.

    Raises:
        UnauthorizedError: no header, another scheme, or no token.
    """
    if header is None or not header.strip():
        raise UnauthorizedError("missing API key: send 'Authorization: Bearer <key>'")
    match = _BEARER.fullmatch(header.strip())
    if match is None:
        raise UnauthorizedError("malformed Authorization header: expected 'Bearer <key>'")
    return match.group(1)


class ApiKeys:
    """The configured API keys; :meth:`check` authorises one request.

    Build with :meth:`from_settings` or :meth:`from_env_value`. See the module
    docstring for the format and rules.
    """

    def __init__(self, keys: list[ApiKey]) -> None:
        by_digest: dict[bytes, ApiKey] = {}
        for key in keys:
            old = by_digest.get(key.digest)
            # The same token in both lists is an admin key.
            if old is None or (key.admin and not old.admin):
                by_digest[key.digest] = key
        self._keys = tuple(by_digest.values())
        #: With no key at all, admin routes are open only when this is set.
        self.admin_open = False

    @classmethod
    def from_env_value(cls, api_keys: str = "", admin_keys: str = "") -> ApiKeys:
        """Parse the two variables' values.

        Raises:
            InvalidArgumentError: a malformed entry, naming the variable (never the token).
        """
        keys = _parse_entries(api_keys, admin=False, var="FACEFUSE_API_KEYS")
        keys += _parse_entries(admin_keys, admin=True, var="FACEFUSE_ADMIN_KEYS")
        return cls(keys)

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiKeys:
        """The keys of ``settings.api_keys`` and ``settings.admin_keys``."""
        return cls.from_env_value(settings.api_keys, settings.admin_keys)

    @property
    def enabled(self) -> bool:
        """True when at least one key is configured (authentication on)."""
        return bool(self._keys)

    @property
    def has_admin(self) -> bool:
        return any(k.admin for k in self._keys)

    def labels(self) -> list[str]:
        """Log names of the configured keys (safe to log)."""
        return [k.label for k in self._keys]

    def __repr__(self) -> str:
        return f"ApiKeys({len(self._keys)} keys, admin={self.has_admin})"

    def match(self, token: str) -> ApiKey | None:
        """The key whose token equals ``token``; compares against every key, in constant time."""
        digest = _digest(token)
        found: ApiKey | None = None
        for key in self._keys:
            if hmac.compare_digest(key.digest, digest):
                found = key
        return found

    def check(self, authorization: str | None, *, admin: bool = False) -> str | None:
        """Authorise a request from its ``Authorization`` header value.

        Args:
            authorization: the header value, or None when absent.
            admin: the route is an admin route.

        Returns:
            The key's log label, or None when authentication is off.

        Raises:
            UnauthorizedError: (401) no, malformed or unknown key. Answer with
                ``WWW-Authenticate: Bearer``.
            ForbiddenError: (403) a valid key that is not an admin key, on an admin route;
                any admin request when no key is configured and ``admin_open`` is off.
        """
        if not self._keys:
            if admin and not self.admin_open:
                raise ForbiddenError("admin routes are closed: configure FACEFUSE_ADMIN_KEYS "
                                     "(or FACEFUSE_ADMIN_OPEN=true for local development)")
            return None
        token = bearer_token(authorization)
        key = self.match(token)
        if key is None:
            raise UnauthorizedError("invalid API key")
        if admin and not key.admin:
            raise ForbiddenError("this route needs an admin key")
        return key.label
