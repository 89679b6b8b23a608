"""A stdio connector's process: spawned, framed, supervised, stopped, and its orphans adopted.

``process`` owns one subprocess; ``framing`` turns its stdio into MCP streams; ``lane`` sends a
``tools/call`` straight onto its stdin; ``stopping`` holds the bounded steps of a stop; ``orphans`` makes
the daemon the parent of last resort for what a connector leaves behind.
"""
