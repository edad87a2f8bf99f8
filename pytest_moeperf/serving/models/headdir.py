"""A draft head's model directory: its ``config.json`` beside its target's tokenizer files (a speculative config
names the directory; vLLM loads the head's weights with the target's ``--load-format dummy``)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["ensure_head_dir"]


def ensure_head_dir(directory: Path, target: Path, config: Mapping[str, Any]) -> Path:
    """``directory`` with ``config`` (its bos, eos and pad ids the target's EOS) and the target directory's files but
    its own configs, written once: staged beside it and renamed into place (race-safe)."""
    if (directory / "config.json").is_file():
        return directory
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        for item in target.iterdir():
            if item.name not in ("config.json", "generation_config.json") and item.is_file():
                shutil.copy(item, staging / item.name)
        eos = json.loads((target / "config.json").read_text())["eos_token_id"]
        body = {**config, "bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}
        (staging / "config.json").write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
        try:
            os.rename(staging, directory)
        except OSError:
            if not (directory / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory
