"""Kernel measurements: model shapes, devices, timing, GEMMs, collectives across ranks, the decode-step budget."""
