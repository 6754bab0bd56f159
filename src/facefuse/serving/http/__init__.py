"""The HTTP edge: the middleware (one a file, stacked in :mod:`.stack`), the ASGI types
and the headers they read (:mod:`.asgi`), the request readers (:mod:`.inputs`), the
error handlers and uvicorn's protocol."""
