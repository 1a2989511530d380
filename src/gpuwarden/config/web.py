"""The exporter's web config, in node_exporter's `--web.config.file` form (a YAML file):

    tls_server_config:
      cert_file: server.crt      # relative paths are read from the file's folder, as node_exporter does
      key_file: server.key
    basic_auth_users:
      prometheus: $2b$12$...     # a bcrypt hash (htpasswd -nBC 12 "" | tr -d ':')

`load` reads and checks it whole (files there, key readable and matching the certificate, each hash a bcrypt
hash), so that `check` refuses what `run` could not serve with. Only these keys: an option gpuwarden would
ignore (client_ca_file, say) is refused, not silently left unenforced. bcrypt is optional (`gpuwarden[web]`).
"""

from __future__ import annotations

import re
import ssl
import threading
from base64 import b64decode
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TLS_KEYS = {"cert_file", "key_file"}
_BCRYPT = re.compile(r"\$2[abxy]\$\d\d\$[./A-Za-z0-9]{53}")
MAX_PASSWORD = 72  # bytes: all that bcrypt reads of a password
_CACHE = 64  # credentials proved lately, kept as a digest: a scrape every 15 s pays one bcrypt, not one each


@dataclass(eq=False, repr=False)
class WebConfig:
    """TLS and basic auth of the exporter's web server."""

    tls: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # name -> bcrypt hash
    _proved: dict[bytes, None] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def allows(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header passes (always, without users). May take a bcrypt (tens of ms)."""
        if (known := self.cached(authorization)) is not None:
            return known
        user, password = _basic(authorization or "")
        if len(password.encode()) > MAX_PASSWORD:
            return False  # bcrypt reads no more (5.x raises: a 500 before), as node_exporter's Go bcrypt refuses it
        import bcrypt  # load() made sure it is there
        known_hash = self.users.get(user)
        # an unknown user costs a bcrypt too: the answer's time does not tell which names exist
        good = bcrypt.checkpw(password.encode(), known_hash or _DUMMY) and known_hash is not None
        if good:
            with self._lock:
                self._proved[_digest(user, password)] = None
                while len(self._proved) > _CACHE:
                    del self._proved[next(iter(self._proved))]
        return good

    def cached(self, authorization: str | None) -> bool | None:
        """allows()'s answer when it takes no bcrypt (no users, credentials proved lately, a header that is not
        basic auth); None when it does, for a caller that must not wait on it (the exporter's loop)."""
        if not self.users:
            return True
        user, password = _basic(authorization or "")
        if user is None:
            return False
        with self._lock:
            return True if _digest(user, password) in self._proved else None


def _digest(user: str, password: str) -> bytes:
    import hashlib  # here: only basic auth needs it (1.5 ms of every start otherwise)

    return hashlib.sha256(b"%s\0%s" % (user.encode(), password.encode())).digest()


_DUMMY = b"$2b$10$" + b"." * 53


def _basic(header: str) -> tuple[str | None, str]:
    import hmac  # with users only, as hashlib

    scheme, _, token = header.partition(" ")
    if not hmac.compare_digest(scheme.lower().encode(), b"basic"):
        return None, ""
    try:
        user, sep, password = b64decode(token.strip(), validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None, ""
    return (user, password) if sep else (None, "")


def load(path: Path) -> WebConfig:
    """The web config at `path`; ValueError saying what is wrong (the caller names the key and line)."""
    try:
        import yaml
    except ImportError:
        raise ValueError("reading it needs PyYAML: pip install 'gpuwarden[web]'") from None
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or (unknown := set(data) - {"tls_server_config", "basic_auth_users"}):
        raise ValueError(f"{path}: only tls_server_config and basic_auth_users are supported, not "
                         f"{', '.join(sorted(map(str, unknown))) if isinstance(data, dict) else repr(data)}")
    return WebConfig(_tls(path, data.get("tls_server_config")), _users(path, data.get("basic_auth_users")))


def _tls(path: Path, section: Any) -> ssl.SSLContext | None:
    if section is None:
        return None
    if not isinstance(section, dict) or set(section) != _TLS_KEYS:
        got = ", ".join(sorted(map(str, section))) if isinstance(section, dict) else repr(section)
        raise ValueError(f"{path}: tls_server_config takes cert_file and key_file, both, nothing else (got {got})")
    files = {key: path.parent / str(section[key]) for key in sorted(_TLS_KEYS)}
    for key, file in files.items():
        if not file.is_file():
            raise ValueError(f"{path}: tls_server_config.{key}: {file}: no such file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2  # node_exporter's default minimum
    try:
        context.load_cert_chain(files["cert_file"], files["key_file"])
    except PermissionError as exc:
        raise ValueError(f"{path}: tls_server_config: {exc.filename}: cannot read it ({exc.strerror})") from None
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"{path}: tls_server_config: the certificate and key do not load together "
                         f"({getattr(exc, 'reason', None) or exc})") from None
    return context


def _users(path: Path, section: Any) -> dict[str, bytes]:
    if section is None:
        return {}
    if not isinstance(section, dict) or not section:
        raise ValueError(f"{path}: basic_auth_users is a map of user name to bcrypt hash")
    for name, hashed in section.items():
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise ValueError(f"{path}: basic_auth_users.{name}: not a bcrypt hash ($2y$10$ and 53 characters; "
                             "make one with: htpasswd -nBC 10 '' | tr -d ':')")
    try:
        import bcrypt
    except ImportError:
        raise ValueError(f"{path}: basic_auth_users needs the bcrypt package (about 0.7 MB): "
                         "pip install 'gpuwarden[web]'") from None
    for name, hashed in section.items():
        try:
            bcrypt.checkpw(b"", hashed.encode())
        except ValueError:
            raise ValueError(f"{path}: basic_auth_users.{name}: bcrypt refuses this hash") from None
    return {str(name): hashed.encode() for name, hashed in section.items()}
