"""The job queue's client: the Dramatiq broker on the job queue's own Redis
(``jobs_redis_url``), a job's message put on the queue, the readiness probe's ping."""

from __future__ import annotations

from typing import Any

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError

__all__ = ["ACTOR", "NAMESPACE", "QUEUE", "broker", "enqueue", "jobs_redis_url", "ping_client",
           "reachable"]

#: The Dramatiq queue of fusion jobs, and the namespace of the broker's keys (the
#: queue's Redis list, ``facefuse-dramatiq:video``, is what an autoscaler watches).
QUEUE = "video"
NAMESPACE = "facefuse-dramatiq"
ACTOR = "fuse_job"
#: Socket and connect timeout of the broker's Redis client, seconds.
REDIS_TIMEOUT_S = 5.0


def jobs_redis_url(settings: Settings) -> str:
    """The job queue's Redis URL.

    Raises:
        InvalidArgumentError: ``jobs_not_configured`` when FACEFUSE_JOBS_REDIS_URL is
            unset (``jobs_unavailable``, 503, is the queue's Redis unreachable).
    """
    if not settings.jobs_redis_url:
        raise InvalidArgumentError("jobs need a Redis of their own: set "
                                   "FACEFUSE_JOBS_REDIS_URL", code="jobs_not_configured")
    return settings.jobs_redis_url


def broker(settings: Settings) -> Any:
    """The Dramatiq Redis broker of ``settings.jobs_redis_url`` (the job queue)."""
    import redis
    from dramatiq.brokers.redis import RedisBroker

    # Bounded socket waits: a worker handing its job back to a Redis that hangs must
    # still stop within its grace period.
    client = redis.Redis.from_url(jobs_redis_url(settings), socket_timeout=REDIS_TIMEOUT_S,
                                  socket_connect_timeout=REDIS_TIMEOUT_S)
    return RedisBroker(client=client, namespace=NAMESPACE,
                       heartbeat_timeout=int(settings.jobs_heartbeat_s * 1000),
                       # A dead worker's message is put back within a few heartbeats.
                       maintenance_chance=50_000)


def enqueue(queue_broker: Any, job_id: str) -> None:
    """Put the message of job ``job_id`` on the :data:`QUEUE` (the worker's actor
    :data:`ACTOR` takes it)."""
    from dramatiq import Message

    queue_broker.enqueue(Message(queue_name=QUEUE, actor_name=ACTOR, args=(job_id,),
                                 kwargs={}, options={}))


#: Socket and connect timeout of the readiness probe's client, seconds.
PING_TIMEOUT_S = 1.0


def ping_client(settings: Settings) -> Any:
    """A Redis client of the job queue for readiness probes (short timeouts)."""
    import redis

    return redis.Redis.from_url(jobs_redis_url(settings), socket_timeout=PING_TIMEOUT_S,
                                socket_connect_timeout=PING_TIMEOUT_S)


def reachable(client: Any) -> bool:
    """Whether ``client``'s Redis answers a PING (blocking: at most its timeouts)."""
    import redis

    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
