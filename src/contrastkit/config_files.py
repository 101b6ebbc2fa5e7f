"""Reading and writing run configuration files (``--config run.yaml``; ``OUT/config.yaml``).

A configuration file is one mapping of option names to values, in YAML (through PyYAML, the
``[yaml]`` extra) or JSON (standard library). JSON is read first whatever the suffix, so a
JSON file, or a ``config.yaml`` written where PyYAML was missing (then it holds JSON, which is
YAML too), needs no extra. Standard library only at import time, so every layer may import it.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Mapping

__all__ = ["read_config_file", "write_config_file", "MAX_BYTES"]

#: A configuration is a few dozen lines; anything larger is refused before parsing.
MAX_BYTES = 1 << 20
YAML_MISSING = "reading YAML needs PyYAML: pip install 'contrastkit[yaml]' (or write the file as JSON)"


def read_config_file(path: "str | os.PathLike[str]") -> Dict[str, Any]:
    """The mapping a configuration file holds; a missing, unparsable or non-mapping file raises
    ``ValueError`` (``FileNotFoundError`` when absent) naming the file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file {path} does not exist" if not os.path.exists(path)
                                else f"config file {path} is not a regular file")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(MAX_BYTES + 1)
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"config file {path} cannot be read ({err})") from None
    if len(text) > MAX_BYTES:
        raise ValueError(f"config file {path} is larger than 1 MiB: not a configuration")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as json_error:
        if path.lower().endswith(".json"):
            raise ValueError(f"config file {path} is not valid JSON (line {json_error.lineno}: "
                             f"{json_error.msg})") from None
        data = _parse_yaml(text, path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of option names to values, "
                         f"got {type(data).__name__}")
    return data


def _parse_yaml(text: str, path: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise ValueError(f"config file {path} is not JSON, and {YAML_MISSING}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"config file {path} does not parse as YAML ({where}{problem})") from None


def write_config_file(path: "str | os.PathLike[str]", options: Mapping[str, Any], *, header: str = "") -> None:
    """Write ``options`` as YAML (as JSON where PyYAML is missing: still YAML, and read back by
    :func:`read_config_file`), atomically; ``header`` lines become comments."""
    path = os.fspath(path)
    try:
        import yaml
    except ImportError:
        text = json.dumps(dict(options), indent=2, sort_keys=True) + "\n"
    else:
        comments = "".join(f"# {line}\n" for line in header.splitlines())
        text = comments + yaml.safe_dump(dict(options), sort_keys=True, default_flow_style=False)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)
