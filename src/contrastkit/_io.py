"""Small file helpers shared by the layers that write run folders (standard library only).

Every writer goes through a temporary file and ``os.replace``, so an interrupted write leaves
the previous file intact rather than a truncated one.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from typing import Any, Dict, Iterable, List


def write_json(path: str, data: Any) -> None:
    """Write ``data`` as indented, key-sorted JSON, atomically."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)


def write_csv(path: str, rows: List[Dict[str, Any]]) -> None:
    """Write rows (dicts with the same keys) as CSV with a header, atomically."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def read_json(path: Any, *, hint: str = "") -> Any:
    """Read JSON; a corrupt file raises ``ValueError`` naming the file and the line."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON (line {err.lineno}: {err.msg}){hint}") from None


def remove_outputs(folder: str, names: Iterable[str]) -> None:
    """Delete the listed files or folders inside ``folder`` (only those: nothing else a user
    keeps there is touched)."""
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
