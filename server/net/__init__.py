"""The network shell: asyncio protocols over the sans-I/O ``tidal.protocol``.

Bytes in, requests handed to a ``Handler``, replies out, with flow control and
authentication. It never imports the engine or storage: it knows the engine
only as ``state.Handler``, a shape with one method.
"""
