"""``--redact``: user names, home paths, host names and IP addresses replaced, consistently, in
every string of a report, for reports that leave the organisation.

Redaction is a pass over the ``Report`` object, not over rendered output: every string reachable
from the report (facts, diagnoses, dict keys and values, tuples, nested dataclasses) goes through
the same ``Redactor``, so every renderer (text, JSON, Markdown, HTML) reads redacted data and no
string can slip past because a renderer quoted it from a field nobody thought of.

It works in two passes over the report:

1. *learn*: host names from the fields that hold them (``SourceRef.host``, ``hosts_seen``,
   ``ProcessFailure.host``, ``SlurmOomKill.node``...) and from patterns in any text (``host:``
   lines of torchrun summaries, ``--master_addr``, ``MASTER_ADDR=``, ``user@host``, NCCL's
   ``host:pid:tid`` prefix, fully qualified names under common domains); user names from home
   paths (``/home/<user>/``, ``/Users/<user>/``, ``/scratch/<user>/``), ``user@host``,
   ``USER=``; plus the current machine's user and host name;
2. *replace*: IPv4/IPv6 addresses become ``ip1, ip2...``, learnt hosts ``host1...`` (a fully
   qualified name and its short name map to the same placeholder), learnt users ``user1...``
   wherever they occur as a word.  The same original always gets the same placeholder within
   one ``Redactor``, so evidence cited from two places still lines up.

What it cannot know: a name that appears nowhere in a recognisable role (a bare colleague's name
in free text) is left as is; very short user names (under three characters) and generic accounts
(``root``, ``user``...) are replaced only inside home paths, not as words everywhere.
"""

from __future__ import annotations

import dataclasses
import getpass
import ipaddress
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from datetime import date, datetime, time, timedelta
from enum import Enum
from typing import Any, TypeVar

T = TypeVar("T")

#: Field names whose string values are host names wherever they occur in the facts.
HOST_FIELDS = frozenset({"host", "hostname", "node", "hosts_seen"})
#: Accounts that are not personal: replaced in home paths, never as words.
GENERIC_USERS = frozenset(
    {"root", "user", "users", "admin", "ubuntu", "debian", "nobody", "shared", "home", "runner"}
)
#: Names that are not host names even when a field says so.
GENERIC_HOSTS = frozenset({"localhost", "localhost.localdomain", "local", "none", "unknown"})
#: Host names that are also words of the reports' own prose ("GPU out of memory"): replacing
#: them as words would garble every sentence, so they are not taken for host names (a cluster
#: that names a node "gpu" keeps that word in the report).
COMMON_WORDS = frozenset(
    {
        "gpu",
        "cpu",
        "cuda",
        "node",
        "nodes",
        "host",
        "master",
        "worker",
        "head",
        "login",
        "compute",
        "train",
        "main",
        "rank",
        "local",
        "server",
        "client",
        "default",
    }
)
_MIN_WORD_LENGTH = 3

_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w]|\.\d)")
# Candidates only; each is checked with ``ipaddress`` (``c10::`` and ``12:34:56`` are not kept).
_IPV6 = re.compile(
    r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{1,4}|(?:\d{1,3}\.){3}\d{1,3})?"
    r"(?:%[\w.]+)?(?![\w:])"
)
_USER_NAME = r"[A-Za-z_](?:[\w-]|\.(?=[\w-])){0,63}"
_HOME_USER = re.compile(
    r"(?P<prefix>/(?:home|Users|scratch|homes|u)/)(?P<user>" + _USER_NAME + r")(?![\w-])"
)
_WINDOWS_USER = re.compile(r"(?P<prefix>[A-Za-z]:\\Users\\)(?P<user>[^\\/\s\"']{1,64})")
_TILDE_USER = re.compile(r"(?<![\w~])~(?P<user>" + _USER_NAME + r")(?=/)")
_USER_AT_HOST = re.compile(
    r"(?<![\w.+-])(?P<user>[A-Za-z_][\w.+-]{0,63})@"
    r"(?P<host>(?=[\w.-]*[A-Za-z])[A-Za-z0-9][A-Za-z0-9-]{1,62}(?:\.[A-Za-z0-9-]{1,63})*)(?![\w-])"
)
_USER_ASSIGN = re.compile(r"\b(?:USER|LOGNAME|USERNAME|SUDO_USER)=(?P<user>" + _USER_NAME + r")")
_HOST_ASSIGN = re.compile(
    r"(?:\b(?:HOSTNAME|MASTER_ADDR|SLURMD_NODENAME|SLURM_NODELIST|HOST)=|--master[_-]addr[= ]"
    r"|\bhost\s*:\s+|\bhostname\s*[:=]\s*|\bNodeName=)"
    r"['\"]?(?P<host>[A-Za-z][A-Za-z0-9-]{0,62}(?:\.[A-Za-z0-9-]{1,63})*)"
)
_NCCL_PREFIX = re.compile(
    r"(?:^|(?<=\s))(?P<host>[A-Za-z][A-Za-z0-9-]{0,62}(?:\.[A-Za-z0-9-]{1,63})*):\d+:\d+ \[\d+\]"
)
_FQDN = re.compile(
    r"(?<![\w.-])(?P<host>[A-Za-z0-9][A-Za-z0-9-]{0,62}(?:\.[A-Za-z0-9-]{1,63})*\."
    r"(?:com|net|org|edu|gov|io|ai|cloud|local|internal|lan|corp|cluster|intra|localdomain|"
    r"compute|priv|private|hpc))(?![\w-])",
    re.IGNORECASE,
)
# deepspeed's launcher passes the host list base64-encoded: it cannot be redacted word by word.
_WORLD_INFO = re.compile(r"(--world_info[= ])[A-Za-z0-9+/=_-]+")
_PLACEHOLDER = re.compile(r"^(?:user|host|ip)\d+$")


class Redactor:
    """Consistent replacement of identifying strings.

    ``learn(obj)`` collects host and user names from an object graph (see the module
    docstring); ``text(s)`` redacts one string; ``apply(obj)`` returns a copy of a graph of
    frozen dataclasses, tuples, lists and dicts with every string (keys included) redacted.
    ``mapping`` shows what was replaced by what (for the person redacting, never for output).
    """

    def __init__(self, *, include_machine: bool = True) -> None:
        self._users: dict[str, str] = {}
        self._hosts: dict[str, str] = {}
        self._ips: dict[str, str] = {}
        self._user_words: re.Pattern[str] | None = None
        self._host_words: re.Pattern[str] | None = None
        self._dirty = True
        if include_machine:
            try:
                self.add_user(getpass.getuser())
            except (KeyError, OSError):  # no passwd entry (containers): nothing to learn
                pass
            self.add_host(socket.gethostname())

    # ------------------------------------------------------------------------- learning

    @property
    def mapping(self) -> dict[str, str]:
        return {**self._users, **self._hosts, **self._ips}

    def add_user(self, name: str) -> None:
        name = name.strip()
        if not name or _PLACEHOLDER.match(name) or name in self._users:
            return
        self._users[name] = f"user{len(self._users) + 1}"
        self._dirty = True

    def add_host(self, name: str) -> None:
        name = name.strip().strip(".").lower()
        if (
            not name
            or name in GENERIC_HOSTS
            or name in COMMON_WORDS
            or len(name) < _MIN_WORD_LENGTH
            or _PLACEHOLDER.match(name)
            or _is_ip(name)
        ):
            return
        if name in self._hosts:
            return
        short = name.split(".", 1)[0]
        placeholder = self._hosts.get(short)
        if placeholder is None:
            placeholder = f"host{len({*self._hosts.values()}) + 1}"
        self._hosts[name] = placeholder
        if (
            short != name
            and short not in GENERIC_HOSTS
            and short not in COMMON_WORDS
            and len(short) >= _MIN_WORD_LENGTH
        ):
            self._hosts.setdefault(short, placeholder)
        self._dirty = True

    def learn_text(self, text: str) -> None:
        """Collect user and host names from one string's patterns."""
        if "/" in text or "\\" in text or "~" in text:
            for pattern in (_HOME_USER, _WINDOWS_USER, _TILDE_USER):
                for match in pattern.finditer(text):
                    self.add_user(match.group("user"))
        if "@" in text:
            for match in _USER_AT_HOST.finditer(text):
                self.add_user(match.group("user"))
                self.add_host(match.group("host"))
        if "=" in text:
            for match in _USER_ASSIGN.finditer(text):
                self.add_user(match.group("user"))
        for pattern in (_HOST_ASSIGN, _NCCL_PREFIX, _FQDN):
            for match in pattern.finditer(text):
                self.add_host(match.group("host"))

    def learn(self, obj: object) -> None:
        """Collect names from every string of ``obj`` (and host fields by their name)."""
        seen: set[int] = set()

        def visit(value: object, field_name: str | None) -> None:
            if isinstance(value, Enum) or value is None:
                return
            if isinstance(value, str):
                if field_name in HOST_FIELDS:
                    self.add_host(value)
                self.learn_text(value)
                return
            if isinstance(value, bool | int | float | bytes | date | time | timedelta):
                return
            if id(value) in seen:
                return
            seen.add(id(value))
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                for spec in dataclasses.fields(value):
                    visit(getattr(value, spec.name), spec.name)
            elif isinstance(value, Mapping):
                for key, item in value.items():
                    visit(key, None)
                    visit(item, None)
            elif isinstance(value, list | tuple | set | frozenset):
                for item in value:
                    visit(item, field_name)

        visit(obj, None)

    # ------------------------------------------------------------------------- replacing

    def _compile(self) -> None:
        if not self._dirty:
            return
        users = sorted(
            (u for u in self._users if len(u) >= _MIN_WORD_LENGTH and u not in GENERIC_USERS),
            key=len,
            reverse=True,
        )
        hosts = sorted(self._hosts, key=len, reverse=True)
        self._user_words = (
            re.compile(
                r"(?<![A-Za-z0-9])(?:" + "|".join(map(re.escape, users)) + r")(?![A-Za-z0-9])"
            )
            if users
            else None
        )
        self._host_words = (
            re.compile(
                r"(?<![A-Za-z0-9-])(?:" + "|".join(map(re.escape, hosts)) + r")(?![A-Za-z0-9-])",
                re.IGNORECASE,
            )
            if hosts
            else None
        )
        self._dirty = False

    def _ip(self, original: str) -> str:
        key = original.lower()
        placeholder = self._ips.get(key)
        if placeholder is None:
            placeholder = self._ips[key] = f"ip{len(self._ips) + 1}"
        return placeholder

    def _replace_ipv6(self, match: re.Match[str]) -> str:
        candidate = match.group(0)
        address = candidate.split("%", 1)[0]
        groups = [g for g in address.split(":") if g]
        if len(groups) < 3 and address not in ("::1",):
            return candidate
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            return candidate
        return self._ip(candidate)

    def _replace_ipv4(self, match: re.Match[str]) -> str:
        candidate = match.group(0)
        try:
            ipaddress.IPv4Address(candidate)
        except ValueError:
            return candidate
        return self._ip(candidate)

    def text(self, value: str) -> str:
        """``value`` with every known or recognisable identity replaced."""
        self._compile()
        out = _WORLD_INFO.sub(r"\1<redacted>", value) if "world_info" in value else value
        if ":" in out:
            out = _IPV6.sub(self._replace_ipv6, out)
        if "." in out:
            out = _IPV4.sub(self._replace_ipv4, out)
        if "/" in out or "\\" in out or "~" in out:
            out = _HOME_USER.sub(self._replace_home, out)
            out = _WINDOWS_USER.sub(self._replace_home, out)
            out = _TILDE_USER.sub(lambda m: "~" + self._user(m.group("user")), out)
        if self._host_words is not None:
            out = self._host_words.sub(lambda m: self._hosts.get(m.group(0).lower(), "host"), out)
        if self._user_words is not None:
            out = self._user_words.sub(lambda m: self._users[m.group(0)], out)
        return out

    def _user(self, name: str) -> str:
        self.add_user(name)
        self._compile()
        return self._users.get(name, name)

    def _replace_home(self, match: re.Match[str]) -> str:
        return match.group("prefix") + self._user(match.group("user"))

    def apply(self, obj: T) -> T:
        """A copy of ``obj`` with every string redacted (see the class docstring).

        Raises TypeError for an object it does not know how to walk: a type that could hold
        strings redaction would miss must be taught here, not silently passed through.
        """
        memo: dict[int, Any] = {}
        return _walk(obj, self.text, memo)  # type: ignore[no-any-return]


_ATOMS = (bool, int, float, bytes, date, datetime, time, timedelta, type(None))


def _walk(value: Any, redact: Callable[[str], str], memo: dict[int, Any]) -> Any:
    if isinstance(value, Enum):
        return value
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, _ATOMS):
        return value
    key = id(value)
    if key in memo:
        return memo[key]
    result: Any
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            spec.name: _walk(getattr(value, spec.name), redact, memo)
            for spec in dataclasses.fields(value)
            if spec.init
        }
        result = dataclasses.replace(value, **changes)
    elif isinstance(value, Mapping):
        result = {_walk(k, redact, memo): _walk(v, redact, memo) for k, v in value.items()}
    elif isinstance(value, tuple):
        items = [_walk(item, redact, memo) for item in value]
        result = type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    elif isinstance(value, list):
        result = [_walk(item, redact, memo) for item in value]
    elif isinstance(value, frozenset | set):
        result = type(value)(_walk(item, redact, memo) for item in value)
    else:
        raise TypeError(f"redaction cannot walk a {type(value).__name__}")
    memo[key] = result
    return result


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def redact_report(report: T, redactor: Redactor | None = None) -> T:
    """``report`` (or any graph of report objects) with identities replaced consistently."""
    redactor = redactor or Redactor()
    redactor.learn(report)
    return redactor.apply(report)


def replace_strings(obj: T, replace: Callable[[str], str]) -> T:
    """``obj`` (a report, or any graph of report objects) with every string in it passed
    through ``replace``: the walk redaction makes, for other consistent rewrites (a spooled
    stream's file shown under the name the user gave it)."""
    return _walk(obj, replace, {})  # type: ignore[no-any-return]


def redact_all(items: Iterable[str], redactor: Redactor) -> list[str]:
    """Convenience for callers holding loose strings (CLI messages)."""
    return [redactor.text(item) for item in items]
