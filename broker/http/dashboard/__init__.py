"""The web dashboard: a page at `/` and its assets under `/dashboard/`, all from this package.

Nothing is fetched from elsewhere at run time (a broker often runs where the internet is not
reachable), and there is no build step: the assets in static/ are the files served. They
are read once at start into memory, so a request can name only a file that exists (no path
ever reaches the file system). Every response carries a Content-Security-Policy that allows
scripts from this origin only, a second wall behind the page's rule of inserting data as text
only: a client ID like `<img src=x onerror=...>` can neither become markup nor run.
"""

from pathlib import Path
from typing import Final

from aiohttp import web

from broker.http.dashboard.login import ASSET_PREFIX, LOGINS_KEY, Logins, login, logout, me

STATIC: Final = Path(__file__).with_name("static")
_TYPES: Final = {
    ".html": "text/html", ".js": "text/javascript", ".css": "text/css",
    ".svg": "image/svg+xml",
}
# ws: and wss: for the WebSocket client page, which connects to the MQTT listener's port.
_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'self'; connect-src 'self' ws: wss:;"
                               " img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

ASSETS_KEY: Final = web.AppKey("dashboard_assets", dict[str, tuple[bytes, str]])


def _load_assets() -> dict[str, tuple[bytes, str]]:
    return {path.name: (path.read_bytes(), _TYPES[path.suffix])
            for path in STATIC.iterdir() if path.suffix in _TYPES}


def _asset(request: web.Request, name: str) -> web.Response:
    found = request.app[ASSETS_KEY].get(name)
    if found is None:
        raise web.HTTPNotFound()
    body, content_type = found
    return web.Response(body=body, content_type=content_type, charset="utf-8",
                        headers=_HEADERS)


async def index(request: web.Request) -> web.Response:
    return _asset(request, "index.html")


async def asset(request: web.Request) -> web.Response:
    return _asset(request, request.match_info["name"])


def add_dashboard_routes(app: web.Application, logins: Logins) -> None:
    app[LOGINS_KEY] = logins
    app[ASSETS_KEY] = _load_assets()
    app.router.add_get("/", index)
    app.router.add_get(ASSET_PREFIX + "{name}", asset)
    app.router.add_post("/api/v5/login", login)
    app.router.add_post("/api/v5/logout", logout)
    app.router.add_get("/api/v5/me", me)
