"""The route template a request is recorded under (``/v1/templates/{template}``)."""

from __future__ import annotations

import re
import weakref
from typing import Any

from starlette.routing import compile_path

from facefuse.serving.http.asgi import Scope

__all__ = ["route_template"]

#: Each app's documented path templates, made once (on its first request not routed).
_PATHS: weakref.WeakKeyDictionary[Any, list[tuple[re.Pattern[str], str]]] = (
    weakref.WeakKeyDictionary())


def route_template(scope: Scope) -> str:
    """The route template of a request, also for one refused before routing ran
    (in-flight bound, draining, body errors), matched against the app's documented
    path templates; ``unmatched`` when none has that path."""
    routed = getattr(scope.get("route"), "path", None)
    if routed:
        return str(routed)
    app = scope.get("app")
    if app is None:
        return "unmatched"
    paths = _PATHS.get(app)
    if paths is None:
        paths = _PATHS[app] = _documented_paths(app)
    path = scope.get("path", "")
    return next((template for regex, template in paths if regex.match(path)), "unmatched")


def _documented_paths(app: Any) -> list[tuple[re.Pattern[str], str]]:
    """(regex, template) of every path in the app's OpenAPI document."""
    try:
        templates = list(app.openapi().get("paths", {}))
    except Exception:  # not an app with a schema (tests of one middleware alone)
        return []
    return [(compile_path(t)[0], t) for t in templates]
