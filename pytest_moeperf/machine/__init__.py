"""The machine a run measures: topology, probing, fingerprint and host, interconnect emulation, GPU placement,
requirement markers, provenance."""
