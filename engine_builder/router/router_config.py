"""RouterConfig: the backends, the policy and the timings of one router, checked once here."""

from __future__ import annotations

from dataclasses import dataclass

from engine_builder.util.errors import InputError

POLICIES = ("round-robin", "least-load", "prefix-aware")
# Seconds between health checks of each backend, and how long one may take: a SIGKILLed replica
# refuses connections at once (taken out by the request that meets it); the checks find a hung one
# and put a restarted one back within about a second.
DEFAULT_HEALTH_INTERVAL_S = 0.5
DEFAULT_HEALTH_TIMEOUT_S = 5.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
# Longest wait for the next byte from a backend: above `serve`'s own --request-timeout (600 s), so a
# working replica always answers first (504 or its timeout event); only a hung one meets this.
DEFAULT_BACKEND_TIMEOUT_S = 630.0
# Longest wait for a backend's first byte (a stream's first event; a non-streamed answer, which `serve`
# sends whole at its end, is its first byte): past it the replica is taken out as hung and the request,
# which has sent nothing to its client yet, goes to another replica. A replica that answered /health but
# never a request once held every client for the 630 s above.
DEFAULT_FIRST_BYTE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RouterConfig:
    backends: tuple[str, ...]  # base URLs, e.g. http://127.0.0.1:8001 (no trailing slash)
    policy: str = "round-robin"
    health_interval: float = DEFAULT_HEALTH_INTERVAL_S
    health_timeout: float = DEFAULT_HEALTH_TIMEOUT_S
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S
    backend_timeout: float = DEFAULT_BACKEND_TIMEOUT_S
    first_byte_timeout: float = DEFAULT_FIRST_BYTE_TIMEOUT_S

    @classmethod
    def create(cls, backends: list[str] | tuple[str, ...] | None, policy: str = "round-robin",
               **timings: float) -> RouterConfig:
        """A checked config: every URL an http(s) base URL, none twice, a known policy, positive timings."""
        if not backends:
            raise InputError("no backend given; name each `trtbuild serve` replica with --backend URL, e.g. "
                             "--backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002")
        urls = tuple(backend_url(b) for b in backends)
        seen = set()
        for url in urls:
            if url in seen:
                raise InputError(f"--backend {url} is given twice; name each replica once")
            seen.add(url)
        if policy not in POLICIES:
            raise InputError(f"--policy {policy!r} is not one of {', '.join(POLICIES)}")
        for name, value in timings.items():
            if not value > 0:
                raise InputError(f"--{name.replace('_', '-')} must be > 0 seconds, got {value}")
        return cls(urls, policy, **timings)


def backend_url(text: str) -> str:
    """`text` as a backend's base URL (scheme://host:port[/prefix], no trailing slash), or a one-line InputError."""
    import httpx  # here, not at the top: every `trtbuild` command imports this module for route's options

    try:
        url = httpx.URL(text.strip())
    except (httpx.InvalidURL, TypeError) as exc:
        raise InputError(f"--backend {text!r} is not a URL ({exc}); give e.g. http://127.0.0.1:8001") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise InputError(f"--backend {text!r} is not an http(s) URL with a host; give e.g. http://127.0.0.1:8001")
    if url.query or url.fragment:
        raise InputError(f"--backend {text!r} has a query or fragment; give the replica's base URL only")
    return str(url.copy_with(path=url.path.rstrip("/") or "")).rstrip("/")
