"""``moeperf dashboard``: a static site from the perf history (SQLite or PostgreSQL, through `history.store`).

`window` picks the sessions shown and groups them into lanes (fingerprint × host); `model` turns their metrics into
the pages' data (pure); `changes` finds the change points (the history's own detector, in parallel); `abresults`
reads ``moeperf ab`` reports; `render` writes the pages' HTML; `build` does the I/O: read, render, and replace
``--out`` whole or not at all. The charts are drawn in the browser by uPlot, shipped in ``static/``.
"""
