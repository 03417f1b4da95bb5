"""Cross-origin requests from browsers: the `cors_allow_origins` setting → Starlette's
`CORSMiddleware` options (preflights are answered before the API key is checked)."""

from __future__ import annotations

import re
from typing import Any

# Headers a browser client may read: the request id, and how long to wait after a 429.
_EXPOSED = ["X-Request-Id", "Retry-After"]


def cors_options(allow_origins: str) -> dict[str, Any] | None:
    """CORSMiddleware's keyword arguments for a comma-separated origin list (None: no CORS).

    `*` allows any origin; an origin ending in `:*` any port of that scheme and host (the
    default allows pages served from localhost, on any port). Credentials are never allowed:
    the API key travels in a header the page sets itself.
    """
    origins = [o.strip().rstrip("/") for o in allow_origins.split(",") if o.strip()]
    if not origins:
        return None
    exact = [o for o in origins if not o.endswith(":*")]
    any_port = [re.escape(o.removesuffix(":*")) + r"(:\d+)?" for o in origins if o.endswith(":*")]
    return {
        "allow_origins": exact,
        "allow_origin_regex": "|".join(any_port) or None,
        "allow_methods": ["*"],
        "allow_headers": ["*"],
        "expose_headers": _EXPOSED,
        "allow_credentials": False,
    }
