"""Builds the FastAPI app of trimtab around an :class:`ApiContext`: routers per resource under ``/v1``,
``/healthz`` and ``/metrics`` at the root, OpenAPI at ``/docs``, the body-size limit and the error mapping.

Reads are open (the server binds loopback unless tokens exist); every write needs a bearer token with a scope.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.staticfiles import StaticFiles

from trimtab.api.auth import Authenticator
from trimtab.api.body_limit import BodyLimitMiddleware
from trimtab.api.context import ApiContext
from trimtab.api.errors import install_error_handlers
from trimtab.api.openapi_doc import fix_document
from trimtab.api.routes import balance, decisions, events, gpu_time, gpus, health, ingest, job_loop, jobs, tokens
from trimtab.api.routes.health import version
from trimtab.api.writers import WriterPool, default_writer_count
from trimtab.store.clocks import ClockBook

DESCRIPTION = """\
trimtab keeps multi-GPU RL training jobs in trim: per-node agents sample GPU and host telemetry into a store, a
rebalancer changes batch size, prefetch depth and sync frequency of live jobs through a training-loop hook.

* Reads are open; writes need `Authorization: Bearer <token>` with scope `agent` (ingest), `job` (register and
  report jobs) or `admin` (everything, including tokens).
* Every response that carries node or GPU data says `simulated` (true for a simulated node).
* Times are epoch milliseconds (`*_ms`), durations seconds (`*_s`); units are in the field names.
"""


def create_app(ctx: ApiContext) -> FastAPI:
    writers = WriterPool(ctx.engine, ctx.ingest_writers or default_writer_count(ctx.engine))

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        writers.close()

    app = FastAPI(title="trimtab", version=version(), description=DESCRIPTION, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    _serve_docs(app)
    app.state.ctx = ctx
    app.state.auth = Authenticator(ctx.engine)
    app.state.writers = writers
    app.state.clocks = ClockBook(ctx.engine)  # the nodes' clocks as this server sees them
    install_error_handlers(app, ctx.engine.dialect.loaded_dbapi)
    app.add_middleware(BodyLimitMiddleware, limit_bytes=lambda: ctx.max_body_bytes)
    for module in (health, gpus, balance, events, ingest, jobs, job_loop, gpu_time, decisions, tokens):
        app.include_router(module.router)
    build_openapi = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = fix_document(build_openapi())
        return app.openapi_schema

    app.openapi = openapi
    return app


SWAGGER_UI = Path(__file__).parent / "static" / "swagger-ui"  # swagger-ui-dist, shipped in the package


def _serve_docs(app: FastAPI) -> None:
    """``/docs``: Swagger UI from files this package ships (``/docs/assets``), never a CDN, so it works on an
    air-gapped cluster; no online validator badge either."""
    app.mount("/docs/assets", StaticFiles(directory=SWAGGER_UI), name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    def docs(request: Request):
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(openapi_url=f"{root}{app.openapi_url}", title="trimtab API",
                                   swagger_js_url=f"{root}/docs/assets/swagger-ui-bundle.js",
                                   swagger_css_url=f"{root}/docs/assets/swagger-ui.css",
                                   swagger_favicon_url=f"{root}/docs/assets/favicon-32x32.png",
                                   swagger_ui_parameters={"validatorUrl": None})


__all__ = ["create_app"]
