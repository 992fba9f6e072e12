"""The engine: applies each request to the core as it is read, and holds its reply
until the group commit that makes it durable (``committer``).

It drives storage through ``tidal.server.storage.interface`` and knows the
network only as the ``Replier`` each request came from.
"""
