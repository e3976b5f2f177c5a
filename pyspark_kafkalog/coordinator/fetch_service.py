"""The coordinator's side of KIP-227 fetch sessions (docs/protocol.md §11.4): one session cache
for every client of a cluster, served by the RPC method ``Fetch``.

Why in the coordinator: KIP-227's cache is a broker's, bounded by ``max.incremental.fetch.
session.cache.slots`` and ranked across all of its fetchers. Every streaming query and ``consume
--follow`` of a cluster asking one coordinator gives the slots, the eviction rules and the
metrics that meaning here too; a cache per process would bound nothing.

Positions are computed here, from the coordinator's own view of the metadata log, whatever a
client sends: the client says which partitions and what it last saw, never where they are.

Privileged sessions are Kafka's follower fetches. Here the only replica fetcher is the
coordinator's own replicator, which holds its session in process (:meth:`replica_session`); a
``Fetch`` that claims ``privileged`` is refused with ``INVALID_REQUEST``, since any client with
the token could otherwise displace every consumer's session (the token says who may call, not
who is a replica).
"""
from __future__ import annotations

from ..errors import InvalidRequestError
from .cluster_positions import ClusterPositions
from .fetch_session import (DEFAULT_CACHE_SLOTS, MIN_EVICTION_MS, FetchSessionCache,
                            FetchSessionClient)
from .fetch_wire import request_from_json, response_to_json


class FetchSessionService:
    """The cache, its position source, and the ``Fetch`` handler (register :meth:`fetch` as a
    mutating method: a standby's or a fenced coordinator's cache is nobody's)."""

    def __init__(self, cluster, *, max_slots: int = DEFAULT_CACHE_SLOTS,
                 min_eviction_ms: int = MIN_EVICTION_MS):
        self.cache = FetchSessionCache(max_slots, min_eviction_ms)
        self.positions = ClusterPositions(cluster)

    def fetch(self, message: dict) -> dict:
        """RPC ``Fetch``: a KIP-227 fetch request in, its response out (``fetch_wire``)."""
        request = request_from_json(message)
        if request.privileged:
            raise InvalidRequestError("Fetch: privileged sessions are the coordinator's own "
                                      "replica fetchers'; a client may not claim one")
        response = self.cache.fetch(request, self.positions)
        # read after the fetch: the view only moves forward, so this is at least the entry
        # the positions (and the absence of changes) were read from
        return response_to_json(response,
                                self.positions.seq if response.error is None else None)

    def replica_session(self) -> FetchSessionClient:
        """A privileged session client over this cache, for the replicator."""
        return FetchSessionClient(self.cache, self.positions, privileged=True)
