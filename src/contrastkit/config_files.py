"""Reading and writing run configuration files (``--config run.yaml``; ``OUT/config.yaml``).

A configuration file is one mapping of option names to values, in YAML (through PyYAML, the
``[yaml]`` extra) or JSON (standard library). JSON is read first whatever the suffix, so a
JSON file, or a ``config.yaml`` written where PyYAML was missing (then it holds JSON, which is
YAML too), needs no extra. Standard library only at import time, so every layer may import it.

A key given twice in one mapping (at the top or nested, in either language) is refused, naming
the file, the key, the mapping it is in and both lines: both parsers would otherwise keep the
last value without a word.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from contrastkit._io import atomic_file

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
        data = json.loads(text, object_pairs_hook=_dict_of_unique_keys)
    except _KeyGivenTwice:
        raise ValueError(_twice_message(path, *_json_key_given_twice(text))) from None
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
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                twice = _yaml_key_given_twice(node, loader, [], set())
                if twice is not None:
                    raise ValueError(_twice_message(path, *twice))
            return None if node is None else loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"config file {path} does not parse as YAML ({where}{problem})") from None


# ------------------------------------------------------------------------------ keys given twice
#
# Where a key is given twice: (key, the keys of the mappings it lies in, its two line numbers).
_Twice = Tuple[str, List[str], int, int]


class _KeyGivenTwice(Exception):
    pass


def _dict_of_unique_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise _KeyGivenTwice
    return result


def _twice_message(path: str, key: str, within: List[str], first: int, second: int) -> str:
    under = f" under {'.'.join(map(repr, within))}" if within else ""
    lines = f"both on line {first}" if first == second else f"lines {first} and {second}"
    return f"config file {path}: key {key!r}{under} is given twice ({lines}); give each key once"


class _Open:
    """A container the JSON walk is inside: its keys so far with their lines (``None`` for an
    array), its last key, and the keys of the mappings around it."""

    def __init__(self, is_object: bool, within: List[str]) -> None:
        self.keys: Optional[Dict[str, int]] = {} if is_object else None
        self.last_key = ""
        self.within = within


def _json_key_given_twice(text: str) -> _Twice:
    """Where the valid JSON ``text`` (which has a key given twice) gives a key twice: a walk over
    its structure, counting lines (a JSON string holds no raw newline)."""
    stack: List[_Open] = []
    line, i, expect_key = 1, 0, False
    while i < len(text):
        char = text[i]
        if char == '"':
            value, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
            here = stack[-1] if stack else None
            if here is not None and here.keys is not None and expect_key:
                if value in here.keys:
                    return value, here.within, here.keys[value], line
                here.keys[value] = line
                here.last_key, expect_key = value, False
            continue
        if char in "{[":
            outer = stack[-1] if stack else None
            within = [] if outer is None else outer.within + ([outer.last_key] if outer.keys is not None else [])
            stack.append(_Open(char == "{", within))
            expect_key = char == "{"
        elif char in "}]":
            stack.pop()
        elif char == ",":
            expect_key = bool(stack) and stack[-1].keys is not None
        elif char == "\n":
            line += 1
        i += 1
    raise AssertionError("a JSON key given twice that the walk did not find")  # pragma: no cover


def _yaml_key_given_twice(node: Any, loader: Any, within: List[str], seen: set) -> Optional[_Twice]:
    """The first key a YAML node tree gives twice in one mapping (merge keys ``<<`` aside, whose
    values the mapping may override), or ``None``; ``seen`` guards against alias cycles."""
    import yaml

    if id(node) in seen:
        return None
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: Dict[Any, int] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = loader.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in lines:
                    return str(key), within, lines[key], line
                lines[key] = line
                inner = within + [str(key)]
            else:
                inner = within
            found = _yaml_key_given_twice(value_node, loader, inner, seen)
            if found is not None:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            found = _yaml_key_given_twice(item, loader, within, seen)
            if found is not None:
                return found
    return None


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
    with atomic_file(path, encoding="utf-8") as handle:
        handle.write(text)
