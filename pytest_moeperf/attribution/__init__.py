"""Decode-step attribution from a real profiler trace: which share of a decode step each component takes."""
