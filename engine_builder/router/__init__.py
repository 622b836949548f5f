"""`trtbuild route`: an HTTP router in front of several `trtbuild serve` replicas.

    from engine_builder.router import route
    route(["http://127.0.0.1:8001", "http://127.0.0.1:8002"], policy="prefix-aware", port=8000)

It speaks only HTTP (the replicas' TGI + OpenAI routes, through httpx): nothing of the runtime is
imported, so it runs where no model does.
"""

from engine_builder.router.router_config import POLICIES, RouterConfig
from engine_builder.router.router_server import route

__all__ = ["POLICIES", "RouterConfig", "route"]
