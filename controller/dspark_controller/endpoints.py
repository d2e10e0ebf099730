"""Endpoint helpers shared by the controller, its CLI and the worker client.

One *base* endpoint names a controller. The three sockets derive from it:

* ``tcp://HOST:P``  -> workers ``tcp://HOST:P``, publisher ``tcp://HOST:P+1``, CLI ``tcp://HOST:P+2``
* ``ipc://PATH``    -> workers ``ipc://PATH``, publisher ``ipc://PATH.pub``, CLI ``ipc://PATH.cli``

Each can be overridden. A TCP bind on anything but a loopback address is refused
unless CurveZMQ is configured (:func:`require_safe_bind`).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

__all__ = ["DEFAULT_BASE", "Endpoints", "ConfigError", "is_loopback_endpoint", "require_safe_bind",
           "connectable", "load_curve_keypair", "load_curve_public_key"]

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
