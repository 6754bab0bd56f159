"""Templates: an image registered once with its analysis, fused by id. The records
(:mod:`.records`), the store's interface (:mod:`.store`) and its two backends
(:mod:`.file_store`, :mod:`.redis_store`), chosen by :func:`build_template_store`."""

from __future__ import annotations

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError
from facefuse.serving.templates.file_store import FileTemplateStore
from facefuse.serving.templates.records import Template
from facefuse.serving.templates.redis_store import RedisTemplateStore
from facefuse.serving.templates.store import (
    RECORD_OVERHEAD,
    StoreHealth,
    TemplateStore,
    template_id,
)

__all__ = [
    "FileTemplateStore",
    "RedisTemplateStore",
    "StoreHealth",
    "Template",
    "TemplateStore",
    "build_template_store",
    "template_id",
]


def build_template_store(settings: Settings) -> TemplateStore:
    """The backend ``settings.templates_backend`` names."""
    bounds = {"max_count": settings.templates_max_count,
              "max_bytes": settings.templates_max_bytes,
              "max_record_bytes": settings.max_body_bytes + RECORD_OVERHEAD}
    if settings.templates_backend == "redis":
        if not settings.templates_redis_url:
            raise InvalidArgumentError("templates_backend=redis needs templates_redis_url")
        return RedisTemplateStore(settings.templates_redis_url, **bounds)
    return FileTemplateStore(settings.template_dir, **bounds)
