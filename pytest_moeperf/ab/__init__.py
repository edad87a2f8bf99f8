"""``moeperf ab``: base against head on the same box, interleaved and paired — one more producer of the ledger
(`runner`) and one more judge (`verdicts` on `paired`), reported by the reporters of a normal run (`report`)."""
