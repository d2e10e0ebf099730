"""Endpoint helpers shared by the controller, its CLI and the worker client.

One *base* endpoint names a controller. The three sockets derive from it:

* ``tcp://HOST:P``  -> workers ``tcp://HOST:P``, publisher ``tcp://HOST:P+1``, CLI ``tcp://HOST:P+2``
* ``ipc://PATH``    -> workers ``ipc://PATH``, publisher ``ipc://PATH.pub``, CLI ``ipc://PATH.cli``

Each can be overridden. A TCP bind on anything but a loopback address is refused
unless CurveZMQ is configured (:func:`require_safe_bind`). :func:`check_endpoint` tells a
malformed address from a good one without touching a socket (the CLI and the client call
it before ZeroMQ would raise on it).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

__all__ = ["DEFAULT_BASE", "Endpoints", "ConfigError", "check_endpoint", "is_loopback_endpoint",
           "require_safe_bind", "connectable", "load_curve_keypair", "load_curve_public_key"]

DEFAULT_BASE = "tcp://127.0.0.1:7150"


class ConfigError(ValueError):
    """Invalid controller/client configuration; the message says how to fix it."""


def _split_tcp(endpoint: str) -> tuple[str, int]:
    rest = endpoint[len("tcp://"):]
    if ";" in rest:
        rest = rest.split(";", 1)[1]
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"{endpoint!r}: a TCP endpoint needs an explicit port, e.g. tcp://127.0.0.1:7150")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class Endpoints:
    router: str
    pub: str
    cli: str

    @staticmethod
    def derive(base: str, *, pub: Optional[str] = None, cli: Optional[str] = None) -> "Endpoints":
        if base.startswith("tcp://"):
            host, port = _split_tcp(base)
            if port == 0 and (pub is None or cli is None):
                raise ConfigError("port 0 cannot derive the publisher and CLI ports; give explicit "
                                  "--pub-bind and --cli-bind endpoints")
            h = f"[{host}]" if ":" in host else host
            return Endpoints(router=base, pub=pub or f"tcp://{h}:{port + 1}",
                             cli=cli or f"tcp://{h}:{port + 2}")
        if base.startswith("ipc://"):
            return Endpoints(router=base, pub=pub or base + ".pub", cli=cli or base + ".cli")
        if base.startswith("inproc://"):
            return Endpoints(router=base, pub=pub or base + ".pub", cli=cli or base + ".cli")
        raise ConfigError(f"unsupported endpoint {base!r}; use tcp://HOST:PORT or ipc:///path/to/socket")


IPC_PATH_MAX_BYTES = 107      # sizeof(sockaddr_un.sun_path) - 1 on Linux; ZeroMQ refuses longer ipc paths


def check_endpoint(address: object, *, option: str = "address", bind: bool = False,
                   allow_inproc: bool = False, example: str = "tcp://127.0.0.1:7150") -> str:
    """``address`` if it is a ZeroMQ endpoint of the form we use, else :class:`ConfigError`.

    Pure (no socket, no name lookup). Accepted: ``tcp://HOST:PORT`` (HOST a name, an IPv4
    address or a bracketed IPv6 address; PORT 1..65535; when ``bind``, HOST may be ``*`` and
    PORT 0, an ephemeral port) and ``ipc://PATH`` (PATH non-empty, at most 107 bytes, the
    Unix-socket limit); ``inproc://NAME`` only with ``allow_inproc`` (it reaches sockets of
    the same ZeroMQ context only, never another process). The message is one line naming
    ``option``, the value and the expected forms (with ``example``), e.g. ``--connect
    'garbage' is not a ZeroMQ address: no transport (tcp:// or ipc://); expected
    tcp://HOST:PORT (e.g. tcp://127.0.0.1:7152) or ipc://PATH``.
    Whether the host resolves or the port is free is only known when the socket is used.
    """
    forms = f"tcp://HOST:PORT (e.g. {example}) or ipc://PATH"

    def bad(why: str) -> ConfigError:
        return ConfigError(f"{option} {address!r} is not a ZeroMQ address: {why}; expected {forms}")

    if not isinstance(address, str) or not address.strip():
        raise bad("it is empty")
    if address != address.strip() or any(c.isspace() for c in address):
        raise bad("it contains whitespace")
    scheme, sep, rest = address.partition("://")
    if not sep:
        raise bad("no transport (tcp:// or ipc://)")
    if scheme == "tcp":
        target = rest.split(";", 1)[1] if ";" in rest else rest      # ZeroMQ's tcp://SOURCE;HOST:PORT
        host, colon, port = target.rpartition(":")
        if not colon or not port.isdigit():
            raise bad("a TCP address needs HOST:PORT with a numeric port")
        if not host:
            raise bad("the host is missing")
        if host.startswith("["):
            ok_host = host.endswith("]") and len(host) > 2 and all(c in "0123456789abcdefABCDEF:." for c in host[1:-1])
        elif host == "*":
            ok_host = bind
        else:
            ok_host = all(c.isalnum() or c in "-._" for c in host) and ":" not in host
        if not ok_host:
            raise bad(f"host {host!r} is not a host name or IP address"
                      + (" ('*' only binds; connect to a host)" if host == "*" else "")
                      + (" (write an IPv6 address in brackets, e.g. tcp://[::1]:7150)" if ":" in host
                         and not host.startswith("[") else ""))
        p = int(port)
        if not (0 if bind else 1) <= p <= 65535:
            raise bad(f"port {p} is outside {0 if bind else 1}..65535")
        return address
    if scheme == "ipc":
        if not rest:
            raise bad("the ipc path is empty")
        if len(rest.encode("utf-8")) > IPC_PATH_MAX_BYTES:
            raise bad(f"the ipc path is {len(rest.encode('utf-8'))} bytes, over the Unix-socket limit of "
                      f"{IPC_PATH_MAX_BYTES} (use a shorter path, e.g. under /tmp)")
        return address
    if scheme == "inproc" and allow_inproc:
        if not rest:
            raise bad("the inproc name is empty")
        return address
    if scheme == "inproc":
        raise bad("inproc:// reaches only sockets in the same process and ZeroMQ context")
    raise bad(f"unsupported transport {scheme + '://'!r}")


def is_loopback_endpoint(endpoint: str) -> bool:
    """True for ipc://, inproc:// and TCP on 127.0.0.0/8, ::1 or localhost."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    if not endpoint.startswith("tcp://"):
        return False
    host, _ = _split_tcp(endpoint)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False          # '*', interface names, hostnames: not provably loopback


def require_safe_bind(endpoints: Endpoints, *, curve_configured: bool) -> None:
    for ep in (endpoints.router, endpoints.pub, endpoints.cli):
        if not is_loopback_endpoint(ep) and not curve_configured:
            raise ConfigError(
                f"refusing to bind {ep}: it is not a loopback address and CurveZMQ is not configured. "
                "Bind to 127.0.0.1 or ipc://, or pass --curve-secret-key FILE and --curve-authorized-dir "
                "DIR (create keys with `python -m zmq.auth`-style certificates: "
                "zmq.auth.create_certificates(dir, name)).")


def connectable(endpoint: str, *, like: str) -> str:
    """Replace a wildcard bind host in ``endpoint`` by the host of ``like`` (the address we dialled)."""
    if not endpoint.startswith("tcp://") or not like.startswith("tcp://"):
        return endpoint
    host, port = _split_tcp(endpoint)
    if host in ("*", "0.0.0.0", "::", ""):
        lhost, _ = _split_tcp(like)
        h = f"[{lhost}]" if ":" in lhost else lhost
        return f"tcp://{h}:{port}"
    return endpoint


def _read_cert(path: Union[str, os.PathLike]) -> tuple[bytes, Optional[bytes]]:
    import zmq.auth

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"CurveZMQ certificate {p} does not exist; create one with "
                          "zmq.auth.create_certificates(directory, name)")
    try:
        public, secret = zmq.auth.load_certificate(str(p))
    except Exception as exc:
        raise ConfigError(f"cannot read CurveZMQ certificate {p}: {exc}") from None
    return public, secret


def load_curve_keypair(path: Union[str, os.PathLike]) -> tuple[bytes, bytes]:
    public, secret = _read_cert(path)
    if not secret:
        raise ConfigError(f"{path} holds no secret key; pass the '.key_secret' file, not the public '.key'")
    return public, secret


def load_curve_public_key(value: Union[str, bytes, os.PathLike]) -> bytes:
    """A 40-char Z85 public key (str/bytes) or a certificate file holding one."""
    if isinstance(value, bytes) and len(value) == 40:
        return value
    if isinstance(value, str) and len(value) == 40 and not Path(value).exists():
        return value.encode("ascii")
    public, _ = _read_cert(value)
    return public


def curve_client_options(server_key, client_cert) -> tuple[Optional[bytes], Optional[tuple[bytes, bytes]]]:
    """A CLI client's CurveZMQ options: (the controller's public key, this client's key pair)
    from ``--curve-server-key`` / ``--curve-client-cert``; both or neither (ConfigError)."""
    if (server_key is None) != (client_cert is None):
        raise ConfigError("CurveZMQ needs both --curve-server-key and --curve-client-cert")
    if server_key is None:
        return None, None
    return load_curve_public_key(server_key), load_curve_keypair(client_cert)
