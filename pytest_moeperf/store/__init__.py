"""The baseline store: one reader and writer of baseline files, one atomic writer, the update lock."""
