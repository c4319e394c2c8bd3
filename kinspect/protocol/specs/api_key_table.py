"""Renders kinspect/protocol/specs/api_keys.py, the table of api keys, from the message specs.

`python -m kinspect.protocol.specs.api_key_table > kinspect/protocol/specs/api_keys.py` (run by `make
specs`) writes it; a test checks the committed module equals a fresh rendering.
"""

from __future__ import annotations

import re

from kinspect.protocol.specs.registry import SpecRegistry


def constant_name(api_name: str) -> str:
    """ApiVersions -> API_VERSIONS, DescribeCluster -> DESCRIBE_CLUSTER."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", api_name).upper()


def render(registry: SpecRegistry | None = None) -> str:
    registry = registry or SpecRegistry.default()
    keys = sorted(registry.api_keys())
    lines = [
        '"""Kafka api keys by name, generated from the message specs by kinspect.protocol.specs.api_key_table: do not edit."""',
        "",
        "from __future__ import annotations",
        "",
    ]
    for key in keys:
        lines.append(f"{constant_name(registry.api_name(key))} = {key}")
    lines += ["", "API_NAMES: dict[int, str] = {"]
    lines += [f"    {key}: {registry.api_name(key)!r}," for key in keys]
    lines += ["}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
