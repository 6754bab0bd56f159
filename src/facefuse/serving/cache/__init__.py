"""The server's two cache levels: :mod:`.lru` (L1 analyses, bounded in bytes),
:mod:`.results` (L2 encoded results, in process or Redis) and :mod:`.keys`."""
