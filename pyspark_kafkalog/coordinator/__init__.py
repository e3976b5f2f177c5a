"""The live side of the protocol: fetch sessions, following a topic, and the coordinator service.

Nothing here imports gRPC or prometheus_client until a coordinator is started or called
(``start``, ``connect``): without a coordinator, everything else works without them.
"""


def start(spark_or_cluster, **kwargs):
    """Start a coordinator beside this driver; see :func:`.embedded.start`."""
    from .embedded import start as start_embedded
    return start_embedded(spark_or_cluster, **kwargs)


def connect(cluster, token=None, **kwargs):
    """A client of the cluster's active coordinator; see :func:`.discovery.connect`."""
    from .discovery import connect as connect_discovered
    return connect_discovered(cluster, token, **kwargs)
