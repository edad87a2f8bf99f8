"""End-to-end serving: tiny model, serve profiles, server launch/attach, load generator, metrics, spec decode."""
