"""`trtbuild route`: an HTTP router in front of several `trtbuild serve` replicas.

    from engine_builder.router import route
    route(["http://127.0.0.1:8001", "http://127.0.0.1:8002"], policy="prefix-aware", port=8000)

It speaks only HTTP (the replicas' TGI + OpenAI routes, through httpx): nothing of the runtime is
imported, so it runs where no model does.
"""

from engine_builder.router.router_config import POLICIES, RouterConfig

__all__ = ["POLICIES", "RouterConfig", "route"]


def __getattr__(name: str):
    # `route` pulls in FastAPI and httpx (~0.3 s): loaded on first use, so `trtbuild run`, which imports
    # the CLI's route command for its options only, does not pay for them (issue 16's cold start)
    if name == "route":
        from engine_builder.router.router_server import route

        return route
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
