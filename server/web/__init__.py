"""The HTTP/JSON edge: the method table over HTTP, the change feed and consumer groups over
Server-Sent Events, health for probes, and the console page; a shell beside ``net``, over
the same engine (docs/PROTOCOL.md, HTTP)."""
