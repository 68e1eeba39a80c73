"""YAML that cannot blow up: alias expansion and nesting are bounded before anything is built.

A YAML alias refers to an anchored node instead of copying it, so 600 bytes of nested aliases
(a "billion laughs" file) parse instantly into a structure that expands to hundreds of
millions of nodes as soon as anything walks it (a comparison, ``json.dumps``, a deep copy):
minutes of CPU and gigabytes of memory. Every YAML entrogym reads from a user (``--config``
files, option values, a run folder's ``config.yaml``) goes through :func:`check_yaml` first:
it counts the nodes the document expands to without expanding it, and measures its nesting
from the parser's events (iteratively: a deeply nested file cannot exhaust the stack).
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_NODES = 100_000  # far above any config (the paper's AppWorld config has ~60 nodes)
MAX_DEPTH = 64


class YamlTooLarge(ValueError):
    """A YAML document expands to too many nodes or nests too deeply."""


def check_yaml(text: str, source: str = "YAML") -> None:
    """Raise :class:`YamlTooLarge` naming ``source`` when ``text`` nests deeper than
    :data:`MAX_DEPTH` or expands (aliases included) to more than :data:`MAX_NODES` nodes.
    Syntax errors are left to the loader that follows."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    depth = 0
    aliases = False
    try:
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise YamlTooLarge(
                        f"{source} is nested more than {MAX_DEPTH} levels deep; refused"
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            elif isinstance(event, yaml.AliasEvent):
                aliases = True
        if not aliases:
            return  # without aliases the node count is at most the text's size
        size = _expanded_size(yaml.compose(text, Loader=loader))
    except yaml.YAMLError as error:
        # libyaml (PyYAML's C loader, 6.0.4 here) scans ahead and refuses nesting past its own
        # limit before the events reach MAX_DEPTH: the same refusal, naming the source
        if "nesting depth" in str(error):
            raise YamlTooLarge(
                f"{source} is nested more than {MAX_DEPTH} levels deep; refused"
            ) from None
        return
    if size > MAX_NODES:
        raise YamlTooLarge(
            f"{source} expands to more than {MAX_NODES:,} nodes through its aliases; "
            "refused (a YAML alias bomb?)"
        )


def _expanded_size(root: Any) -> int:
    """Nodes ``root`` stands for with every alias expanded, counted once per node object
    (aliases share their anchor's node) and capped just past :data:`MAX_NODES`; a node that
    contains itself (a recursive anchor) expands without end."""
    too_many = MAX_NODES + 1
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # on the current path from the root
    stack: list[tuple[Any, bool]] = [(root, False)]  # (node, its children are sized)
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            sizes[key] = min(too_many, 1 + sum(sizes[id(c)] for c in _children(node)))
        elif key in open_nodes:
            return too_many  # recursive
        elif key not in sizes:
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in _children(node))
    return sizes[id(root)]


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def safe_load(text: str, source: str = "YAML") -> Any:
    """``yaml.safe_load(text)`` after :func:`check_yaml`."""
    check_yaml(text, source)
    return yaml.safe_load(text)
