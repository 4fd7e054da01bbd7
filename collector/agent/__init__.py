"""The per-node agent: sample this node, spool each batch durably, push it to the central server."""
